"""`mnemo bench locomo` without a store (the consolidation and the retriever replaced by fakes): every
user's index is warmed before the clock, so with one K no timed query is a user's cold first one, and
the tables say how many queries p50 / p99 were taken over."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import evaluation.locomo
from evaluation.common import evaluate, warm_up
from memory.settings import Settings
from retrieval.retriever import RetrievalResult

COLD_MS, WARM_MS = 500.0, 1.0


class ColdFirstRetriever:
    """Answers nothing; a user's first query takes COLD_MS (its index load), later ones WARM_MS."""

    def __init__(self, *_: Any) -> None:
        self.settings = Settings().retrieval
        self.loaded: set[str] = set()
        self.calls: list[tuple[str, str]] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.zeros((len(texts), 4), dtype=np.float32)

    def retrieve(self, user: str, vec: np.ndarray, k: int = 10, strategy: str = "dense",
                 text: str | None = None) -> RetrievalResult:
        ms = WARM_MS if user in self.loaded else COLD_MS
        self.loaded.add(user)
        self.calls.append((user, strategy))
        return RetrievalResult(user_id=user, query=text, strategy=strategy, k=k,
                               signals={"timings": {"retrieve_ms": ms}})


def questions() -> list[dict[str, Any]]:
    """Grouped by user as LoCoMo's are: the first 20 all of one conversation."""
    users = ["conv-a"] * 25 + ["conv-b"] * 3 + ["conv-c"] * 3
    return [{"user": u, "question": f"q{i}", "category": 1 + i % 4, "evidence": {"D1:1"}} for i, u in enumerate(users)]


class FakeStore:
    def count_by_user(self, table: str) -> dict[str, int]:
        return {"conv-a": 1}


def test_with_one_k_no_timed_query_is_a_users_cold_first_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    class Report:
        counts: dict[str, int] = {}
    monkeypatch.setattr(evaluation.locomo, "consolidate_locomo", lambda *a: (FakeStore(), Report()))
    monkeypatch.setattr(evaluation.locomo, "load_questions", lambda *a: questions())
    monkeypatch.setattr(evaluation.locomo, "Retriever", ColdFirstRetriever)
    out = evaluation.locomo.bench_locomo("locomo.json", strategies=["dense"], ks=[10], store=str(tmp_path))
    lines = out.splitlines()
    head = next(ln for ln in lines if ln.startswith("| strategy |"))
    row = next(ln for ln in lines if ln.startswith("| dense |"))
    cells = dict(zip([c.strip() for c in head.strip("|").split("|")], [c.strip() for c in row.strip("|").split("|")]))
    assert cells["p99 ms"] == f"{WARM_MS:.2f}" and cells["timed"] == "31"
    assert "timed = queries behind p50 / p99" in out and "plus the newer versions" in out


def test_warm_up_queries_every_strategy_for_the_first_question_of_every_user() -> None:
    r = ColdFirstRetriever()
    qs = questions()
    warm_up(r, qs, r.embed([q["question"] for q in qs]), 10, ["dense", "rfmem"])   # type: ignore[arg-type]
    assert r.calls == [(u, s) for u in ("conv-a", "conv-b", "conv-c") for s in ("dense", "rfmem")]


def test_evaluate_counts_the_timed_queries() -> None:
    r = ColdFirstRetriever()
    qs = questions()[:17]
    row = evaluate(r, qs, r.embed([q["question"] for q in qs]), "dense", (5, 10))   # type: ignore[arg-type]
    assert row["timed"] == 17   # the largest K's pass only


def test_locomo_evidence_with_a_stray_colon_is_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """LoCoMo writes some evidence as "D:11:26": it names dialogue D11:26, not nothing; an id no turn
    has is kept (never found) and counted in a warning."""
    import json

    from evaluation.common import load_questions
    from memory.ingest import ingest
    from memory.store import Store

    turns = [{"speaker": "Ann", "dia_id": f"D1:{i}", "text": f"turn {i} about tea"} for i in (1, 2)]
    sample = {"sample_id": "conv-x", "conversation": {"speaker_a": "Ann", "speaker_b": "Bob",
                                                      "session_1_date_time": "1:56 pm on 8 May, 2023",
                                                      "session_1": turns},
              "qa": [{"question": "What about tea?", "answer": "x", "evidence": ["D:1:2"], "category": 1},
                     {"question": "And coffee?", "answer": "y", "evidence": ["D1:9"], "category": 1}]}
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps([sample]))
    store = Store(str(tmp_path / "store"))
    ingest(store, path, "locomo")
    qs = load_questions(str(path), store)
    assert [len(q["evidence"]) for q in qs] == [1, 1]
    assert next(iter(qs[0]["evidence"])).endswith("D1:2") and qs[1]["evidence"] == {"missing:D1:9"}
    assert "1 evidence ids name no message of their conversation" in caplog.text
