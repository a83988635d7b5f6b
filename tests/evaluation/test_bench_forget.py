"""`mnemo bench forget` end to end on a trimmed LoCoMo conversation (three sessions): the figures it
prints, the forgotten session gone, Recall@10 outside it not lower by more than 0.01; the questions
scored are left out only for the session their own user forgot (ids repeat across users)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evaluation.forget import outside_forgotten, sessions_of
from flows.cli import app
from memory.ingest import ingest
from memory.runs import open_store
from memory.settings import Settings
from tests.helpers import LOCOMO


def trimmed(path: Path, sessions: int = 3) -> Path:
    """The first LoCoMo sample cut to its first `sessions` sessions and the questions about them."""
    sample = json.loads(LOCOMO.read_text())[0]
    conv = sample["conversation"]
    keep = {f"session_{i}" for i in range(1, sessions + 1)}
    sample["conversation"] = {k: v for k, v in conv.items()
                              if not k.startswith("session_") or k.removesuffix("_date_time") in keep}
    sample["qa"] = [q for q in sample["qa"] if q.get("evidence") and all(
        int(m.group(1)) <= sessions for e in q["evidence"] for m in re.finditer(r"D(\d+):", str(e)))]
    for extra in ("observation", "session_summary", "event_summary"):
        sample.pop(extra, None)
    path.write_text(json.dumps([sample]))
    return path


@pytest.mark.skipif(not LOCOMO.exists(), reason="LoCoMo dev split not present")
def test_bench_forget_prints_its_figures(tmp_path: Path) -> None:
    data = trimmed(tmp_path / "locomo3.json")
    out = CliRunner().invoke(app, ["bench", "forget", str(data), "--store", str(tmp_path / "store")])
    assert out.exit_code == 0, out.output
    text = out.output
    for figure in ("| table | rows deleted | rows re-derived |", "LLM calls paid / cache hits", "bytes reclaimed",
                   "Recall@10 (default strategy)", "| messages |"):
        assert figure in text, figure
    assert "| drop within 0.01 | yes |" in text
    hits = re.search(r"LLM calls paid / cache hits \| (\d+) / (\d+)", text)
    assert hits is not None and int(hits.group(2)) > 0   # the unchanged prompts came from the cache


def test_a_question_is_left_out_only_for_its_own_users_forgotten_session(tmp_path: Path) -> None:
    """LoCoMo's ids repeat per conversation (every user has a `session_2` and a `D2:1`): user a
    forgetting session_1 and user b session_2 must not drop a's questions about its session_2."""
    turns = tmp_path / "two.jsonl"
    turns.write_text("".join(json.dumps({"user_id": u, "session_id": f"session_{s}", "message_id": f"D{s}:1",
                                         "speaker": "user", "text": f"{u} says something in session {s}",
                                         "timestamp": f"2025-01-0{s}T00:00:00+00:00"}) + "\n"
                             for u in ("a", "b") for s in (1, 2)))
    st = open_store(Settings().with_overrides(store=str(tmp_path / "store")))
    ingest(st, str(turns), "jsonl")
    chosen = {"a": "session_1", "b": "session_2"}
    questions = [{"user": "a", "question": "a1", "evidence": {"D1:1"}},
                 {"user": "a", "question": "a2", "evidence": {"D2:1"}},
                 {"user": "b", "question": "b1", "evidence": {"D1:1"}},
                 {"user": "b", "question": "b2", "evidence": {"D2:1"}},
                 {"user": "b", "question": "b12", "evidence": {"D1:1", "D2:1"}}]
    kept = outside_forgotten(questions, sessions_of(st, ["a", "b"]), chosen)
    assert [q["question"] for q in kept] == ["a2", "b1"]
