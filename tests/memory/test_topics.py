"""RMM prospective reflection: the D.1.1 / D.1.2 prompts parsed strictly, the rules stand-in
(breakpoint segmentation, threshold merge), and the `topics` stage: provenance, merges keep the
union of sources and a history, re-runs, crashes and batch splits converge."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memory import prompts
from memory.ingest import ingest
from memory.llm.base import LLMBackend, LLMRequest, LLMResponse, register_backend
from memory.llm.rules import topic_merge_answer, topic_segments, topics_answer
from memory.llm.runner import LLMRunner, check
from memory.runs import consolidate, open_store
from memory.settings import Settings
from memory.store import Store
from tests.helpers import SAMPLE, crash_before_watermarks, ingest_and_consolidate, killed_before, split_sample


def test_merge_answers_are_parsed_strictly() -> None:
    schema = prompts.topic_merge_schema(3)
    assert check('{"action": "Add()"}', schema)[0] is not None
    ok, _ = check('{"action": "Merge(2, Ann runs on Mondays and Fridays.)"}', schema)
    assert prompts.parse_topic_merge(ok, 3) == ("merge", 2, "Ann runs on Mondays and Fridays.")
    for bad in ('{"action": "Merge(3, x)"}', '{"action": "Merge(0, )"}', '{"action": "Update(0, x)"}',
                '{"action": "Add() extra"}', '{"action": "Merge(1 x)"}', 'Add()'):
        assert check(bad, schema)[0] is None, bad
    with pytest.raises(ValueError):
        prompts.parse_topic_merge({"action": "Merge(4, x)"}, 3)


def test_extraction_references_must_be_turns_of_the_session() -> None:
    schema = prompts.topic_extract_schema(4)
    assert check('{"extracted_memories": [{"summary": "Ann runs", "reference": [0, 3]}]}', schema)[0]
    assert check('{"extracted_memories": []}', schema)[0] == {"extracted_memories": []}
    assert check('{"extracted_memories": [{"summary": "Ann runs", "reference": [4]}]}', schema)[0] is None
    assert check('{"extracted_memories": [{"summary": "Ann runs", "reference": []}]}', schema)[0] is None
    turns = [{"message_id": f"m{i}"} for i in range(4)]
    parsed = prompts.parse_topic_extraction({"extracted_memories": [{"summary": " Ann  runs ", "reference": [3, 0, 3]}]},
                                            turns)
    assert parsed == [{"summary": "Ann runs", "source_ids": ["m0", "m3"]}]


def test_rules_segment_at_breakpoints_and_merge_above_threshold() -> None:
    sims = [0.8, 0.7, 0.75, 0.1, 0.8, 0.7, 0.9]
    assert topic_segments(sims, 8) == [(0, 4), (4, 8)]
    assert topic_segments([0.5] * 29, 30)[0][1] - topic_segments([0.5] * 29, 30)[0][0] <= 10
    ctx = {"subject": "Ann", "participants": ["Ann", "Ben"], "adjacent_sims": sims, "turns": [
        {"turn": i, "message_id": f"m{i}", "speaker": "Ann" if i % 2 == 0 else "Ben", "text": t}
        for i, t in enumerate(["I adopted a rescue dog named Rex last week.", "Nice!", "My dog Rex loves the beach.",
                               "Cool.", "I started a pottery class at the community center.", "Fun!",
                               "My first bowl cracked in the kiln.", "Oh no."])]}
    answer = topics_answer(ctx)
    mems = answer["extracted_memories"]
    assert len(mems) == 2 and mems[0]["reference"] == [0, 2] and mems[1]["reference"] == [4, 6]
    assert "Ann adopted" in mems[0]["summary"] and check(json.dumps(answer), prompts.topic_extract_schema(8))[0]
    hist = [{"summary": "Ann adopted a dog.", "similarity": 0.4}, {"summary": "Ann has a dog named Rex.",
                                                                   "similarity": 0.9}]
    merged = topic_merge_answer({"history": hist, "new_summary": "Rex loves the beach.", "threshold": 0.75})
    assert merged == {"action": "Merge(1, Ann has a dog named Rex. Rex loves the beach.)"}
    assert topic_merge_answer({"history": hist[:1], "new_summary": "x", "threshold": 0.75}) == {"action": "Add()"}


def test_rules_topics_stay_within_the_schema_on_huge_statements() -> None:
    """A long assistant-style statement with no sentence end is cut at a word, never past the schema."""
    huge = "I really love " + " ".join(["hiking and"] * 800) + " more"
    ctx = {"subject": "Ann", "participants": ["Ann", "Ben"], "adjacent_sims": [0.9, 0.9], "turns": [
        {"turn": i, "message_id": f"m{i}", "speaker": s, "text": t}
        for i, (s, t) in enumerate([("Ann", huge), ("Ben", "Nice!"), ("Ann", huge)])]}
    answer = topics_answer(ctx)
    assert answer["extracted_memories"] and check(json.dumps(answer), prompts.topic_extract_schema(3))[0]
    merged = topic_merge_answer({"history": [{"summary": answer["extracted_memories"][0]["summary"],
                                              "similarity": 0.9}], "new_summary": "Ann " + huge, "threshold": 0.5})
    assert check(json.dumps(merged), prompts.topic_merge_schema(1))[0]


# -- the stage --------------------------------------------------------------------------------------
#: the sample is small: a low threshold makes the rules merge, so merges get exercised
MERGE_OFTEN = {"topic_merge_threshold": 0.45}


def _snapshot(store: Store) -> dict[str, Any]:
    rows = store.read("topics").to_pylist()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "duplicate topic ids"
    return {r["id"]: (r["text"], tuple(r["source_ids"]), r["date"], r["merges"],
                      tuple((h["text"], h["merged_id"]) for h in json.loads(r["history_json"])))
            for r in rows}


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return ingest_and_consolidate(tmp_path_factory.mktemp("topics") / "clean", SAMPLE, **MERGE_OFTEN)


def test_topics_are_memories_with_provenance(clean: Store) -> None:
    rows = clean.read("topics").to_pylist()
    assert rows and any(r["merges"] > 0 for r in rows)
    for user in clean.users():
        own = set(clean.read("messages", user, columns=["message_id"]).column("message_id").to_pylist())
        for r in clean.read("topics", user).to_pylist():
            assert r["user_id"] == user and r["source_ids"] and set(r["source_ids"]) <= own
            assert len(r["vector"]) == 384 and r["text"] and r["key"] and r["backend"] == "rules"
            history = json.loads(r["history_json"])
            assert len(history) == r["merges"]
            added = [x for h in history for x in h["added_ids"]]   # each merge records the ids it added
            assert set(added) <= set(r["source_ids"]) and len(added) == len(set(added))
            if r["merges"]:
                assert r["prompt_version"] == prompts.TOPIC_MERGE_VERSION and " to " in r["date"]
    from retrieval import RetrievalSettings, Retriever

    r = Retriever(clean, RetrievalSettings(refresh_ms=0))
    res = r.retrieve(clean.users()[0], "guitar", k=5, kinds=["topic"])
    assert res.items and all(it.kind == "topic" for it in res.items)


def test_a_history_written_whole_still_rolls_back(clean: Store) -> None:
    """History entries an older mnemo wrote hold the replaced version's whole source list: the bank
    as of a watermark before the merges is the same from them as from the added ids."""
    import numpy as np

    from memory.stages.topics import load_bank

    user = clean.users()[0]
    rows = clean.read("topics", user).to_pylist()
    first = min(r["created_ts"] for r in rows)
    now = load_bank(clean, user, first)[0]
    old = [dict(r) for r in rows]
    for r in old:
        history, sources = json.loads(r["history_json"]), list(r["source_ids"])
        for h in reversed(history):
            added = set(h.pop("added_ids"))
            sources = [x for x in sources if x not in added]
            h["source_ids"] = sources
        r["history_json"] = json.dumps(history)
    clean.upsert("topics", old)
    try:
        legacy = load_bank(clean, user, first)[0]
    finally:
        clean.upsert("topics", rows)
    assert any(json.loads(r["history_json"]) for r in old)
    assert [(t.id, t.text, t.source_ids, t.merges) for t in legacy] == [(t.id, t.text, t.source_ids, t.merges) for t in now]
    assert all(np.array_equal(a.vector, b.vector) or a.vector is None for a, b in zip(legacy, now))


def test_rerun_changes_nothing(clean: Store) -> None:
    before = _snapshot(clean)
    report = consolidate(clean, Settings(store=clean.uri, **MERGE_OFTEN))
    assert report.llm.get("calls", 0) == 0 and _snapshot(clean) == before


def test_two_batches_equal_one(clean: Store, tmp_path: Path) -> None:
    a, b = split_sample(tmp_path)
    two = ingest_and_consolidate(tmp_path / "two", a, b, **MERGE_OFTEN)
    assert _snapshot(two) == _snapshot(clean)


def test_crash_after_topics_before_watermarks_converges(clean: Store, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Topics (merges included) written, watermarks not: the re-run rolls the bank back and redoes it."""
    a, b = split_sample(tmp_path)  # batch 1 consolidated here: merges depend on the patched threshold
    store = crash_before_watermarks(monkeypatch, ingest_and_consolidate(tmp_path / "crash", a, **MERGE_OFTEN), b,
                                    **MERGE_OFTEN)
    assert _snapshot(store) == _snapshot(clean)


def test_crash_of_a_late_sessions_run_does_not_merge_twice(clean: Store, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A late session's merge leaves its target dated before the watermark, so the bank's roll-back
    does not undo it; the re-run after a crash (everything but progress and watermarks written) must
    not merge the same topic again."""
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    on_time, late = tmp_path / "on_time.jsonl", tmp_path / "late.jsonl"
    on_time.write_text("".join(json.dumps(r) + "\n" for r in rows if r["session_id"] != "alice-s2"))
    late.write_text("".join(json.dumps(r) + "\n" for r in rows if r["session_id"] == "alice-s2"))
    stores = {}
    for name in ("clean", "crash"):
        store = stores[name] = ingest_and_consolidate(tmp_path / name, on_time, **MERGE_OFTEN)
        ingest(store, late, "jsonl")
        if name == "crash":
            with killed_before(monkeypatch, "progress"):
                consolidate(store, Settings(store=store.uri, **MERGE_OFTEN))
        consolidate(store, Settings(store=store.uri, **MERGE_OFTEN))
    merged = [h["merged_id"] for r in stores["crash"].read("topics").to_pylist()
              for h in json.loads(r["history_json"]) if h["merged_session_id"] == "alice-s2"]
    assert merged and len(merged) == len(set(merged))
    assert _snapshot(stores["crash"]) == _snapshot(stores["clean"])


@register_backend("bad-topic-merge")
class _BadMerge(LLMBackend):
    """Rules for everything but topic-merge, which it answers with an out-of-range index."""

    name = "bad-topic-merge"
    live = False
    default_model = "bad-v1"

    def complete(self, requests: list[LLMRequest]) -> list[LLMResponse]:
        from memory.llm.rules import RulesBackend

        out = RulesBackend().complete(requests)
        return [LLMResponse(text='{"action": "Merge(9, nothing)"}') if r.task == "topic-merge" else o
                for r, o in zip(requests, out)]


def test_bad_merge_answers_are_retried_once_then_quarantined_and_added(tmp_path: Path) -> None:
    settings = Settings(store=str(tmp_path / "bad"), llm="bad-topic-merge", **MERGE_OFTEN)
    store = open_store(settings)
    ingest(store, SAMPLE, "jsonl")
    consolidate(store, settings)
    q = [r for r in store.read("quarantine").to_pylist() if r["stage"] == "topic-merge"]
    assert q and all("Merge(9" in r["raw"] and "re-ask" in r["reason"] for r in q)
    rows = store.read("topics").to_pylist()
    assert rows and all(r["merges"] == 0 for r in rows)        # every topic kept, as an Add
    runner = LLMRunner(_BadMerge())
    req = prompts.topic_merge_request({"user_id": "u", "subject": "A", "new_summary": "x", "threshold": 0.5,
                                       "history": [{"id": "t", "summary": "y", "similarity": 0.9}]})
    answers, bad = runner.run([req])
    assert answers == [None] and len(bad) == 1 and runner.stats.calls == 2
