"""`mnemo bench beam`: the benchmark on one BEAM 100K development chat (its messages shortened so the
test stays fast: every message id, batch and question is kept), the update-first rule (undecidable
questions counted apart), the evidence flattening, user copies and other users on a tiny chat (memory
counted for the chats asked only), the report's legend and columns, and the argument checks."""
from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from evaluation.beam import Consolidation, ScaleResult, UpdateFirst, evidence_ids, run_beam, scale_order
from evaluation.beam_report import consolidation_lines, report, table
from memory.errors import ConfigError
from memory.ingest import ingest
from memory.runs import open_store
from memory.settings import Settings
from retrieval.retriever import RetrievalResult, UnknownStrategyError
from tests.helpers import REPO

BEAM = REPO.parent / "shared" / "data" / "beam"
CHAT = BEAM / "100K" / "1"
#: characters kept of each message (the consolidation of a whole 100K chat takes minutes on 2 cores)
KEEP = 400


def settings() -> Settings:
    """Defaults, with `familiarity` as the default strategy so two strategies are scored."""
    base = Settings()
    return Settings(retrieval=base.retrieval.with_overrides(default_strategy="familiarity"))


def shortened_copy(src: Path, dst: Path, keep: int = KEEP) -> None:
    dst.mkdir(parents=True)
    chat = json.loads((src / "chat.json").read_text())
    for batch in chat:
        for group in batch["turns"]:
            for message in group:
                message["content"] = message["content"][:keep]
    (dst / "chat.json").write_text(json.dumps(chat))
    (dst / "probing_questions.json").write_bytes((src / "probing_questions.json").read_bytes())


@pytest.mark.skipif(not (CHAT / "chat.json").is_file(), reason="BEAM development data not present")
def test_bench_beam_on_one_100k_chat(tmp_path: Path) -> None:
    shortened_copy(CHAT, tmp_path / "100K" / "1")
    [res] = run_beam(str(tmp_path), strategies=["dense"], settings=settings())

    assert res.scale == "100K" and res.chats == ["beam-100K-1"]
    assert [r["strategy"] for r in res.rows] == ["dense", "familiarity"]
    raw = json.loads((CHAT / "probing_questions.json").read_text())
    with_evidence = {a for a, qs in raw.items() if any(evidence_ids(q.get("source_chat_ids")) for q in qs)}
    assert set(res.abilities) == with_evidence and "abstention" not in with_evidence
    assert res.no_evidence == len(raw.get("abstention", []))
    assert res.missing_evidence == 0
    n_updates = sum(q["ability"] == "knowledge_update" for q in res.questions)
    for row in res.rows:
        for key, value in row.items():
            if key.startswith("R@"):
                assert 0.0 <= value <= 1.0, (row["strategy"], key, value)
        assert 0.0 <= row["update-first"] <= 1.0
        assert row["uf n"] == n_updates > 0
        assert 0.0 < row["p50 ms"] <= row["p99 ms"]
    dense = res.rows[0]
    assert dense["R@10"] > 0 and dense["R@10"] >= dense["R@5"]

    c = res.consolidation
    assert [u for u, *_ in c.chats] == ["beam-100K-1"] and c.messages > 100 and c.seconds > 0
    assert {"extract", "embed"} <= set(c.stages) and c.peak_mb > 0
    assert len(res.cold_ms) == 1 and res.memory["fragments"] > 0

    text = report(res, BEAM / "ANCHORS.md")
    assert "BEAM 100K" in text and "| strategy |" in text and "update-first" in text
    assert "consolidation: 1 chats" in text and "peak RSS" in text and "anchors (raw messages" in text


def tiny_chat(folder: Path) -> None:
    folder.mkdir(parents=True)
    turns = [[{"role": "user", "id": 0, "content": "I adopted a beagle named Biscuit.", "time_anchor": "March-1-2024"},
              {"role": "assistant", "id": 1, "content": "Congratulations on adopting Biscuit!"}],
             [{"role": "user", "id": 2, "content": "I moved to Lisbon for a new job at a bakery."},
              {"role": "assistant", "id": 3, "content": "Lisbon is a lovely city for bakers."}]]
    (folder / "chat.json").write_text(json.dumps([{"batch_number": 1, "turns": turns}]))
    questions = {"information_extraction": [{"question": "What is the name of my dog?", "source_chat_ids": [0]}],
                 "knowledge_update": [{"question": "Where do I work?",
                                       "source_chat_ids": {"original_info": [0], "updated_info": [2]}}],
                 "abstention": [{"question": "What is my sister's name?"}]}
    (folder / "probing_questions.json").write_text(json.dumps(questions))


def test_user_copies_are_consolidated_but_not_asked(tmp_path: Path) -> None:
    tiny_chat(tmp_path / "100K" / "7")
    [res] = run_beam(str(tmp_path), scales=["100K"], strategies=["dense"], copies=2, settings=settings())
    assert [u for u, *_ in res.consolidation.chats] == ["beam-100K-7", "beam-100K-7-copy2"]
    assert {q["user"] for q in res.questions} == {"beam-100K-7"}
    assert len(res.questions) == 2 and res.no_evidence == 1
    assert all(0.0 <= r["R@5"] <= 1.0 and r["uf n"] == 1 for r in res.rows)


def test_evidence_ids_flatten_lists_and_dicts() -> None:
    assert evidence_ids([[4, 60], [116, 4]]) == {"4", "60", "116"}
    assert evidence_ids({"original_info": [86], "updated_info": [114, [115]]}) == {"86", "114", "115"}
    assert evidence_ids(None) == set() and evidence_ids([]) == set()


def _result(*sources: list[str]) -> RetrievalResult:
    items: list[Any] = [SimpleNamespace(kind="message", key="", source_ids=s) for s in sources]
    return RetrievalResult(user_id="u", query="q", strategy="dense", k=10, items=items)


def test_update_first_counts_missing_and_ties_as_not_first() -> None:
    uf = UpdateFirst()
    q = {"updated": {"2"}, "original": {"1"}}
    uf(q, _result(["2"], ["1"]))         # updated first
    uf(q, _result(["1"], ["2"]))         # original first
    uf(q, _result(["1"]))                # updated missing
    uf(q, _result(["9"]))                # neither
    uf(q, _result(["1", "2"]))           # one memory cites both
    uf(q, _result(["3"], ["2"]))         # original missing: updated first
    uf({"question": "no update"}, _result(["2"]))  # not a knowledge update: ignored
    row = uf.row()
    assert row["uf n"] == 6 and row["uf neither"] == 1 and row["uf tie"] == 1
    assert row["update-first"] == pytest.approx(2 / 6)
    assert math.isnan(UpdateFirst().row()["update-first"])


def test_arguments_are_checked_before_any_work(tmp_path: Path) -> None:
    tiny_chat(tmp_path / "100K" / "1")
    with pytest.raises(ConfigError, match="no scale folder"):
        run_beam(str(tmp_path), scales=["1M"])
    with pytest.raises(UnknownStrategyError):
        run_beam(str(tmp_path), strategies=["nope"])
    with pytest.raises(ConfigError, match="at least 1"):
        run_beam(str(tmp_path), copies=0)
    with pytest.raises(ConfigError, match="holds no"):
        run_beam(str(tmp_path / "empty"))
    assert sorted(["1M", "500K", "100K"], key=scale_order) == ["100K", "500K", "1M"]


def test_a_reused_store_prints_no_cost_per_message() -> None:
    reused = Consolidation(chats=[("beam-100K-1", 0, 0.14)], cpu_s=0.5)
    lines = consolidation_lines(reused)
    assert "0 messages" in lines[0] and "n/a ms/message" in lines[0] and "(n/a ms/msg)" in lines[2]
    fresh = consolidation_lines(Consolidation(chats=[("beam-100K-1", 200, 10.0)], cpu_s=20.0))
    assert "50.0 ms/message" in fresh[0] and "100.0 ms/message" in fresh[0] and "(50 ms/msg)" in fresh[2]


def test_an_update_whose_updated_message_is_also_original_is_undecidable() -> None:
    """BEAM names one message as both original and updated for some questions: never first. They stay
    in the printed share (the issue's definition) and are counted apart, with the decidable share."""
    uf = UpdateFirst()
    uf({"updated": {"2"}, "original": {"1"}}, _result(["2"], ["1"]))           # first
    uf({"updated": {"5"}, "original": {"5"}}, _result(["5"]))                  # one message: a tie, undecidable
    uf({"updated": {"7"}, "original": {"6", "7"}}, _result(["9"]))             # a subset: undecidable too
    uf({"updated": {"3", "4"}, "original": {"3"}}, _result(["4"], ["3"]))      # partly shared: can be first
    row = uf.row()
    assert row["uf n"] == 4 and row["uf undecidable"] == 2
    assert row["update-first"] == pytest.approx(2 / 4) and row["uf decidable"] == pytest.approx(2 / 2)
    assert math.isnan(UpdateFirst().row()["uf decidable"])


def scale_result(validity: bool = True) -> ScaleResult:
    """A measured scale as `run_beam` returns it, figures made up (one strategy, 17 timed queries)."""
    questions = [{"user": "beam-100K-1", "question": "q", "ability": "knowledge_update", "evidence": {"1"}}]
    row = {"strategy": "dense", "R@5": 0.5, "R@10": 0.75, "R@5 cknowledge_update": 0.5,
           "R@10 cknowledge_update": 0.75, "update-first": 0.4, "uf n": 5, "uf neither": 1, "uf tie": 1,
           "uf undecidable": 1, "uf decidable": 0.5, "p50 ms": 2.0, "p99 ms": 9.0, "timed": 17}
    return ScaleResult(scale="100K", chats=["beam-100K-1"], questions=questions, no_evidence=0, missing_evidence=0,
                       rows=[row], cold_ms=[100.0], cold_tokenized=0, cold_rows=10, consolidation=Consolidation(),
                       default_strategy="dense", memory={"messages": 4}, peak_mb=1.0,
                       copies_memory={"messages": 4}, validity=validity)


def test_the_report_says_what_dense_returns_and_how_many_queries_were_timed(tmp_path: Path) -> None:
    text = report(scale_result(), tmp_path / "ANCHORS.md", copies=2)
    assert "dense = top-K over raw messages, plus the newer versions" in text and "retrieval.validity" in text
    assert "dense = top-K over raw messages (validity off)" in report(scale_result(False), tmp_path / "ANCHORS.md")
    head, _, cells = table(scale_result()).splitlines()
    columns = dict(zip(*([c.strip() for c in line.strip("|").split("|")] for line in (head, cells))))
    assert columns["p99 ms"] == "9.00" and columns["timed"] == "17"
    assert columns["update-first"] == "0.400" and columns["uf decidable"] == "0.500"
    assert "1 of the 5 undecidable" in text and "over the other 4" in text
    assert "memory of these chats' users {'messages': 4} (their copies apart: {'messages': 4})" in text


def test_memory_counts_only_the_chats_asked(tmp_path: Path) -> None:
    """A reused store holding another user, and copies: the memory counts are the asked chat's own."""
    tiny_chat(tmp_path / "data" / "100K" / "7")
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"user_id": "aaa-other", "session_id": "s1", "message_id": f"m{i}",
                                         "speaker": "user", "text": f"note {i} about gardening",
                                         "timestamp": f"2025-01-01T00:00:0{i}+00:00"}) + "\n" for i in range(6)))
    ingest(open_store(Settings().with_overrides(store=str(tmp_path / "stores" / "100K"))), str(other), "jsonl")
    [res] = run_beam(str(tmp_path / "data"), strategies=["dense"], copies=2, store=str(tmp_path / "stores"),
                     settings=settings())
    assert res.memory["messages"] == 4 and res.copies_memory["messages"] == 4
    assert res.memory["fragments"] == res.copies_memory["fragments"] > 0
    assert all(r["timed"] == len(res.questions) for r in res.rows)
