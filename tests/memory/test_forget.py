"""Forget (issue 11) on a real consolidated store: canaries gone from every byte under the store,
provenance coherent, the forget path equal to a fresh consolidation of what remains, idempotent,
crash-safe, refused during a run, and the LLM cache purged through its reverse index."""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from lancedb.expr import col, lit

from evaluation.forget import BACKEND as CACHED_RULES   # `rules` answered through a live backend's path
from memory.errors import RunInProgressError
from memory.forget import ForgetReport, forget
from memory.ingest import append, ingest
from memory.runs import consolidate, open_store
from memory.settings import Settings
from memory.store import Store
from retrieval import Retriever
from tests.helpers import SAMPLE, Killed, copy_store, killed_before, run_lease_held

CANARY = "ZQXCANARY42"       # in one message of alice-s1
SESSION_CANARY = "ZQXSESSION77"  # in a message of alice-s2, the session forgotten whole
BOB_CANARY = "ZQXBOBCANARY9"  # bob's: must survive every forget of alice


def canary_archive(path: Path, drop_session: str | None = None, drop_message: str | None = None) -> Path:
    """The sample with the canaries planted (first-person, so the rules extract them); without
    `drop_session`'s messages, or the message `drop_message`, when given."""
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    for r in rows:
        if r["message_id"] == "alice-s1-m03":
            r["text"] += f" My locker code is {CANARY} and I love it."
        if r["session_id"] == "alice-s2" and r["speaker"] == "Alice" and SESSION_CANARY not in json.dumps(rows):
            r["text"] += f" I named my cat {SESSION_CANARY} and I love her."
        if r["user_id"] == "bob" and r["speaker"] != "assistant" and BOB_CANARY not in json.dumps(rows):
            r["text"] += f" I call my bike {BOB_CANARY} and I love it."
    rows = [r for r in rows if r["session_id"] != drop_session and r["message_id"] != drop_message]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def occurrences(root: Path, text: str) -> int:
    """How often `text` occurs in the bytes of every file under `root`."""
    return sum(p.read_bytes().count(text.encode()) for p in root.rglob("*") if p.is_file())


def build(root: Path, archive: Path, **settings: Any) -> tuple[Store, Settings]:
    s = Settings(store=str(root), **settings)
    store = open_store(s)
    ingest(store, archive, "jsonl")
    consolidate(store, s)
    return store, s


@pytest.fixture(scope="module")
def canary_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The canary sample consolidated once (tests take copies)."""
    tmp = tmp_path_factory.mktemp("forget")
    build(tmp / "store", canary_archive(tmp / "canary.jsonl"))
    return tmp / "store"


def fresh(canary_store: Path, tmp_path: Path) -> tuple[Store, Settings, Path]:
    store = copy_store(canary_store, tmp_path / "store")
    return store, Settings(store=store.uri), tmp_path / "store"


def provenance_ok(store: Store, forgotten: set[str]) -> None:
    """Every remaining row's sources exist in `messages`, none is forgotten."""
    have = set(store.read("messages", columns=["message_id"]).column("message_id").to_pylist())
    assert not have & forgotten
    for name in ("fragments", "insights", "topics", "summaries", "observations"):
        if store.has_table(name):
            for r in store.read(name, columns=["id", "source_ids"]).to_pylist():
                assert set(r["source_ids"] or []) <= have, (name, r["id"])
    frags = set(store.read("fragments", columns=["id"]).column("id").to_pylist())
    for r in store.read("clusters", columns=["member_ids"]).to_pylist():
        assert set(r["member_ids"]) <= frags
    for r in store.read("insights", columns=["parent_ids"]).to_pylist():
        assert set(r["parent_ids"]) <= frags


def test_forget_message_purges_every_byte(canary_store: Path, tmp_path: Path) -> None:
    store, s, root = fresh(canary_store, tmp_path)
    assert occurrences(root, CANARY) > 0 and occurrences(root, BOB_CANARY) > 0
    assert occurrences(root, CANARY.lower()) > 0                    # the stored BM25 terms hold it too
    report = forget(store, s, "alice", messages=["alice-s1-m03"])
    assert report.messages == 1 and report.deleted["messages"] == 1 and report.purged
    assert report.deleted["fragments"] >= 1 and report.rederived["fragments"] > 0
    assert occurrences(root, CANARY) == 0 and occurrences(root, CANARY.lower()) == 0
    assert occurrences(root, BOB_CANARY) > 0
    assert len(list((root / "units.lance" / "data").iterdir())) == 1   # the commit marker's history purged too
    provenance_ok(store, {"alice-s1-m03"})
    again = forget(store, s, "alice", messages=["alice-s1-m03"])     # idempotent
    assert again.messages == 0 and not any(again.deleted.values()) and not again.rederived
    assert forget(store, s, "alice", messages=["no-such-message"]).messages == 0
    nightly = consolidate(store, s)                                   # nothing redone, nothing skipped
    assert nightly.counts.get("sessions", 0) == 0
    runs = store.read("runs", where=col("kind") == lit("forget")).to_pylist()
    assert runs and all(r["status"] == "completed" for r in runs)
    assert all(CANARY not in (r["counts_json"] or "") for r in runs)


def test_forget_session_equals_fresh_consolidation(canary_store: Path, tmp_path: Path) -> None:
    store, s, root = fresh(canary_store, tmp_path)
    gone = set(store.read("messages", where=col("session_id") == lit("alice-s2"), columns=["message_id"])
               .column("message_id").to_pylist())
    report = forget(store, s, "alice", sessions=["alice-s2"])
    assert report.messages == len(gone) > 0
    assert occurrences(root, SESSION_CANARY) == 0 and occurrences(root, BOB_CANARY) > 0
    assert occurrences(root, SESSION_CANARY.lower()) == 0
    provenance_ok(store, gone)
    assert "alice-s2" not in store.read("sessions", columns=["session_id"]).column("session_id").to_pylist()
    ref, _ = build(tmp_path / "ref", canary_archive(tmp_path / "rest.jsonl", drop_session="alice-s2"))

    def frags(st: Store) -> set[tuple[str, str]]:
        return {(r["id"], r["text"]) for r in st.read("fragments", columns=["id", "text"]).to_pylist()}

    assert frags(store) == frags(ref)
    # the store was consolidated in one batch, like the fresh one: every derived table agrees too
    for name in ("insights", "clusters", "links", "topics", "summaries", "graph_nodes", "graph_edges", "progress",
                 "messages", "sessions"):
        ids = [set(st.read(name, columns=["id"]).column("id").to_pylist()) for st in (store, ref)]
        assert ids[0] == ids[1], name
    wm = {r["user_id"]: r["last_session_ts"] for r in store.read("watermarks").to_pylist()}
    assert wm == {r["user_id"]: r["last_session_ts"] for r in ref.read("watermarks").to_pylist()}
    assert consolidate(store, s).counts.get("sessions", 0) == 0


def test_forgetting_a_sessions_first_message_leaves_its_time_nowhere(canary_store: Path, tmp_path: Path) -> None:
    """The session's time becomes its first kept message's, in the session row and every re-derived
    row, exactly as a fresh consolidation of what remains gives."""
    store, s, root = fresh(canary_store, tmp_path)
    forget(store, s, "alice", messages=["alice-s2-m01"])
    ref, _ = build(tmp_path / "ref", canary_archive(tmp_path / "rest.jsonl", drop_message="alice-s2-m01"))
    for name, column in (("sessions", "ts"), ("fragments", "session_ts"), ("insights", "session_ts"),
                         ("clusters", "session_ts"), ("graph_nodes", "session_ts")):
        rows = [{(r["id"], r[column]) for r in st.read(name, columns=["id", column]).to_pylist()} for st in (store, ref)]
        assert rows[0] == rows[1], name
    assert consolidate(store, s).counts.get("sessions", 0) == 0


def test_a_turn_appended_during_a_partial_forget_is_consolidated_after(canary_store: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """An append (write lease only) landing between a forget's plan and its writes: to a session the
    forget cuts, the session row counts it and the next run consolidates it; to the session the forget
    names, it is forgotten with the rest, never left without a session row."""
    import memory.forget

    rederive = memory.forget.rederive
    late: list[dict[str, Any]] = []

    def append_after(*args: Any) -> Any:      # the re-derivation read the user's turns before this one
        state = rederive(*args)
        append(open_store(s), "alice", late)
        return state

    monkeypatch.setattr(memory.forget, "rederive", append_after)
    store, s, root = fresh(canary_store, tmp_path)
    late[:] = [{"session_id": "alice-s2", "message_id": "alice-s2-m90", "speaker": "Alice",
                "text": "I bought a capo yesterday.", "timestamp": "2024-03-16T23:00:00Z"}]
    forget(store, s, "alice", messages=["alice-s2-m01"])
    stored = store.read("messages", "alice", where=col("session_id") == lit("alice-s2")).num_rows
    [row] = store.read("sessions", "alice", where=col("session_id") == lit("alice-s2")).to_pylist()
    assert row["n_messages"] == stored
    assert consolidate(store, s).counts.get("messages", 0) >= 1
    [m] = store.read("messages", "alice", where=col("message_id") == lit("alice-s2-m90")).to_pylist()
    assert m["vector"] is not None                                     # made memory by the next run

    monkeypatch.setattr(memory.forget, "rederive", rederive)   # and before the re-derivation reads the turns
    planned = memory.forget.deletions

    def append_before(st: Store, p: Any) -> dict[str, set[str]]:
        append(open_store(s), "alice", late)
        return planned(st, p)

    monkeypatch.setattr(memory.forget, "deletions", append_before)
    late[:] = [{"session_id": "alice-s1", "message_id": "alice-s1-m91", "speaker": "Alice",
                "text": "My gate code is EARLYCANARY67.", "timestamp": "2024-03-03T23:00:00Z"}]
    forget(store, s, "alice", messages=["alice-s1-m01", "alice-s1-m91"])   # m91 named before it exists
    assert store.read("messages", "alice", where=col("message_id") == lit("alice-s1-m91")).num_rows == 0
    assert occurrences(root, "EARLYCANARY67") == 0 and occurrences(root, "earlycanary67") == 0
    monkeypatch.setattr(memory.forget, "deletions", planned)
    monkeypatch.setattr(memory.forget, "rederive", append_after)

    late[:] = [{"session_id": "alice-s3", "message_id": "alice-s3-m90", "speaker": "Alice",
                "text": "My new PIN is LATECANARY66.", "timestamp": "2024-03-30T23:00:00Z"}]
    forget(store, s, "alice", sessions=["alice-s3"])
    assert store.read("messages", "alice", where=col("session_id") == lit("alice-s3")).num_rows == 0
    assert store.read("sessions", "alice", where=col("session_id") == lit("alice-s3")).num_rows == 0
    assert occurrences(root, "LATECANARY66") == 0


def test_forget_user_keeps_other_users(canary_store: Path, tmp_path: Path, embedder: Any) -> None:
    store, s, root = fresh(canary_store, tmp_path)
    before = Retriever(store, s, embedder).retrieve("bob", "what do I call my bike?", k=10).ids
    report = forget(store, s, "alice")
    assert report.deleted["messages"] > 0
    assert occurrences(root, CANARY) == 0 and occurrences(root, SESSION_CANARY) == 0
    assert occurrences(root, CANARY.lower()) == occurrences(root, SESSION_CANARY.lower()) == 0
    assert occurrences(root, BOB_CANARY) > 0 and occurrences(root, BOB_CANARY.lower()) > 0
    for name in ("messages", "sessions", "fragments", "insights", "topics", "summaries", "graph_nodes",
                 "progress", "watermarks", "clusters"):
        assert "alice" not in store.count_by_user(name), name
    indices = [f for f in root.rglob("*") if f.is_file() and "_indices" in f.parts]
    assert indices and not any(b"alice" in f.read_bytes() for f in indices)    # user_id indexes rebuilt
    after = Retriever(store, s, embedder).retrieve("bob", "what do I call my bike?", k=10).ids
    assert after == before
    assert forget(store, s, "alice").messages == 0


def test_whole_user_forget_takes_rows_appended_after_its_plan(canary_store: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A live append (it takes only the write lease) that lands between the plan and the writes is
    forgotten with the rest of the user: no orphan message survives."""
    import memory.forget

    store, s, root = fresh(canary_store, tmp_path)
    planned = memory.forget.deletions

    def append_meanwhile(st: Store, p: Any) -> dict[str, set[str]]:
        append(open_store(s), "alice", [{"session_id": "alice-s9", "message_id": "alice-s9-m01", "speaker": "Alice",
                                         "text": "My PIN is LATECANARY55.", "timestamp": "2024-04-20T10:00:00Z"}])
        return planned(st, p)

    monkeypatch.setattr(memory.forget, "deletions", append_meanwhile)
    forget(store, s, "alice")
    assert not store.count_by_user("messages").get("alice") and not store.count_by_user("sessions").get("alice")
    assert occurrences(root, "LATECANARY55") == 0


def test_whole_user_forget_reads_each_planned_table_once(canary_store: Path, tmp_path: Path,
                                                         store_reads: list[str]) -> None:
    """The whole-user deletions take the ids the plan read (`Plan.rows`), not another read of each table;
    only the tables live appends write are read again, under the write lease."""
    store, s, _ = fresh(canary_store, tmp_path)
    store_reads.clear()
    assert forget(store, s, "alice", keep_versions=True).deleted["fragments"] > 0   # the purge reads aside
    planned = ("watermarks", "fragments", "insights", "clusters", "links", "topics", "summaries", "graph_nodes")
    assert {name: store_reads.count(name) for name in planned} == dict.fromkeys(planned, 1)
    assert {name: store_reads.count(name) for name in ("messages", "sessions")} == {"messages": 2, "sessions": 2}
    assert store_reads.count("observations") <= 1
    assert not any(store.read(name, "alice").num_rows for name in planned)


def test_crash_midway_is_completed_by_the_next_forget(canary_store: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    store, s, root = fresh(canary_store, tmp_path)
    with killed_before(monkeypatch, "watermarks"):
        forget(store, s, "alice", sessions=["alice-s2"])
    assert store.read("runs", where=col("status") == lit("started")).num_rows == 1
    forget(store, s, "alice", sessions=["alice-s2"])
    assert store.read("runs", where=col("status") == lit("started")).num_rows == 0
    assert occurrences(root, SESSION_CANARY) == 0
    provenance_ok(store, set())
    assert consolidate(store, s).counts.get("sessions", 0) == 0


def test_a_purge_that_fails_is_finished_by_the_next_forget(canary_store: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The deletes are written, the purge dies: the run stays `purging` and the next forget (even one
    that finds nothing to delete) purges; the finished run keeps no forgotten message id."""
    import memory.forget

    store, s, root = fresh(canary_store, tmp_path)

    def dies(*_: Any) -> None:
        raise Killed("purge")

    with monkeypatch.context() as m:
        m.setattr(memory.forget, "purge", dies)
        with pytest.raises(Killed):
            forget(store, s, "alice", sessions=["alice-s2"])
    assert store.read("runs", where=col("status") == lit("purging")).num_rows == 1
    assert occurrences(root, SESSION_CANARY) > 0       # deleted, still in old versions
    again = forget(store, s, "alice", sessions=["alice-s2"])
    assert again.messages == 0 and again.purged
    assert occurrences(root, SESSION_CANARY) == 0
    runs = store.read("runs", where=col("kind") == lit("forget")).to_pylist()
    assert [r["status"] for r in runs] == ["completed", "completed"]
    assert not any("alice-s2-m" in (r["counts_json"] or "") for r in runs)


def test_quarantined_rows_of_forgotten_messages_and_sessions_go(canary_store: Path, tmp_path: Path) -> None:
    """A named message that only the quarantine holds (its timestamp did not parse), and a LoCoMo turn
    quarantined without its session id in the raw record (the session is in its source), go too."""
    store, s, root = fresh(canary_store, tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"user_id": "alice", "session_id": "alice-s1", "message_id": "alice-s1-m99",
                               "speaker": "Alice", "text": "QUARCANARY31", "timestamp": "yesterday-ish"}) + "\n")
    ingest(store, bad, "jsonl")
    assert occurrences(root, "QUARCANARY31") > 0
    report = forget(store, s, "alice", messages=["alice-s1-m99"])
    assert report.messages == 0 and report.deleted["quarantine"] == 1 and report.purged
    assert occurrences(root, "QUARCANARY31") == 0

    locomo = tmp_path / "loco.json"
    locomo.write_text(json.dumps([{"sample_id": "ann", "conversation": {
        "speaker_a": "Ann", "speaker_b": "Bo", "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "I moved to Lisbon."},
                      {"speaker": "Ann", "text": "My bank PIN is LOCOCANARY27."}],
        "session_2_date_time": "2:00 pm on 9 May, 2023",   # a whole session quarantined (not a list)
        "session_2": {"speaker": "Ann", "dia_id": "D2:1", "text": "My locker is LOCOCANARY28."}},
        "observation": {"session_1_observation": {"Ann": [["Ann's PIN is LOCOCANARY29."]]}}}]))
    ingest(store, locomo, "locomo", observations_as_fragments=True)
    assert occurrences(root, "LOCOCANARY27") > 0 and occurrences(root, "LOCOCANARY28") > 0
    assert occurrences(root, "LOCOCANARY29") > 0                      # a malformed observation of session_1
    assert forget(store, s, "ann", sessions=["session_1", "session_2"]).deleted["quarantine"] == 3
    assert occurrences(root, "LOCOCANARY27") == 0 and occurrences(root, "LOCOCANARY28") == 0
    assert occurrences(root, "LOCOCANARY29") == 0

    # a user only the quarantine knows: a named forget takes the named row, not all of the user's
    carol = tmp_path / "carol.jsonl"
    carol.write_text("".join(json.dumps({"user_id": "carol", "session_id": "c-s1", "message_id": f"c-m{i}",
                                         "speaker": "Carol", "text": "hi", "timestamp": "soon"}) + "\n"
                             for i in range(3)))
    ingest(store, carol, "jsonl")
    assert forget(store, s, "carol", messages=["c-m0"]).deleted["quarantine"] == 1
    assert store.read("quarantine", "carol").num_rows == 2


def test_quarantined_rows_without_a_session_or_user_go_too(canary_store: Path, tmp_path: Path) -> None:
    """Rows the quarantine could not file under the user (invalid JSON, bad encoding), a bad turn dated
    before a `before` cut, and a BEAM turn (its source names user and session) are found and purged."""
    store, s, root = fresh(canary_store, tmp_path)
    lines = [b'{"user_id": "alice", "session_id": "alice-s1", "text": "NULLCANARY1", oops',
             b'{"user_id": "alice", "session_id": "alice-s1", "text": "NULLCANARY2 caf\xe9"}',
             json.dumps({"user_id": "alice", "session_id": "alice-s1", "message_id": "m\u0000",
                         "speaker": "Alice", "text": "OLDCANARY3", "timestamp": "2024-03-01T00:00:00Z"}).encode(),
             b'{"user_id": "bob", "text": "BOBNULL4", oops']
    (tmp_path / "bad.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    ingest(store, tmp_path / "bad.jsonl", "jsonl")
    assert all(occurrences(root, c) > 0 for c in ("NULLCANARY1", "OLDCANARY3", "BOBNULL4"))
    forget(store, s, "alice", before=datetime(2024, 3, 2, tzinfo=timezone.utc))
    assert occurrences(root, "OLDCANARY3") == 0 and occurrences(root, "NULLCANARY1") > 0
    forget(store, s, "alice")
    assert occurrences(root, "NULLCANARY1") == 0 and occurrences(root, "NULLCANARY2") == 0
    assert occurrences(root, "BOBNULL4") > 0                            # another user's row stays

    chat = tmp_path / "beam" / "100K" / "1" / "chat.json"
    chat.parent.mkdir(parents=True)
    chat.write_text(json.dumps([{"batch_number": 1, "time_anchor": "March-1-2024", "turns": [[
        {"id": 0, "role": "user", "content": "hello"}, {"id": 1, "content": "BEAMCANARY5 has no role"}]]}]))
    ingest(store, tmp_path / "beam", "beam")
    assert occurrences(root, "BEAMCANARY5") > 0
    assert forget(store, s, "beam-100K-1", sessions=["batch-1"]).deleted["quarantine"] == 1
    assert occurrences(root, "BEAMCANARY5") == 0


def test_forget_waits_for_a_running_consolidation(canary_store: Path, tmp_path: Path) -> None:
    store, s, _ = fresh(canary_store, tmp_path)
    with run_lease_held(store.uri), pytest.raises(RunInProgressError):
        forget(store, s.with_overrides(run_lease_wait_s=0.2), "alice", sessions=["alice-s2"])
    assert store.read("messages", where=col("session_id") == lit("alice-s2")).num_rows > 0


def test_cache_entries_of_forgotten_messages_are_deleted(tmp_path: Path) -> None:
    store, s = build(tmp_path / "store", canary_archive(tmp_path / "c.jsonl"), llm=CACHED_RULES)
    cache = store.read("llm_cache", columns=["id", "user_id", "message_ids"]).to_pylist()
    assert cache and all(r["user_id"] in ("alice", "bob") for r in cache)
    assert any("alice-s2-m01" in (r["message_ids"] or []) for r in cache)
    report = forget(store, s, "alice", sessions=["alice-s2"])
    assert report.cache_hits > 0                      # unchanged prompts were not paid again
    assert report.deleted["llm_cache"] > 0
    left = store.read("llm_cache", columns=["message_ids"]).to_pylist()
    assert not any(m.startswith("alice-s2-") for r in left for m in r["message_ids"] or [])
    assert occurrences(tmp_path / "store", SESSION_CANARY) == 0
    assert occurrences(tmp_path / "store", BOB_CANARY) > 0


def test_keep_versions_skips_the_purge(canary_store: Path, tmp_path: Path) -> None:
    store, s, root = fresh(canary_store, tmp_path)
    report = forget(store, s, "alice", messages=["alice-s1-m03"], keep_versions=True)
    assert not report.purged and "keep-versions" in report.summary()
    assert store.read("messages", where=col("message_id") == lit("alice-s1-m03")).num_rows == 0
    assert occurrences(root, CANARY) > 0            # still in older versions, as documented


def test_feedback_on_deleted_memories_and_rerankers_trained_on_it_go(canary_store: Path, tmp_path: Path,
                                                                     embedder: Any) -> None:
    from datetime import datetime, timedelta, timezone

    store, s, _ = fresh(canary_store, tmp_path)
    r = Retriever(store, s, embedder)
    frags = store.read("fragments", "alice", columns=["id", "session_id"]).to_pylist()
    s1 = [f["id"] for f in frags if f["session_id"] == "alice-s1"][:2]
    s2 = [f["id"] for f in frags if f["session_id"] == "alice-s2"][:1]
    assert s1 and s2
    hit = r.feedback("alice", "what is my cat called?", shown_ids=s1[:1] + s2, cited_ids=s2)["id"]
    kept = r.feedback("alice", "what do I play?", shown_ids=s1, cited_ids=s1[:1])["id"]
    now = datetime.now(timezone.utc)
    later, earlier = now + timedelta(seconds=1), now - timedelta(days=1)
    # (scope, version, trained on feedback until, started from): global 2 saw the deleted feedback; bob's
    # first version started from it (his second descends from that); carol's from global 1, which stays
    lineage = [("global", 1, earlier, 0), ("global", 2, later, 1), ("user:alice", 1, earlier, 1),
               ("user:bob", 1, later, 2), ("user:bob", 2, later, 1), ("user:carol", 1, later, 1)]
    store.upsert("rerankers", [{
        "id": f"rr-{scope}-{v}", "version": v, "scope": scope, "user_id": scope.partition(":")[2] or None,
        "created_at": now, "dim": store.dim, "weights": b"", "sha256": "", "feedback_until": until,
        "metrics_json": json.dumps({"from_version": start}), "run_id": "test"} for scope, v, until, start in lineage])
    report = forget(store, s, "alice", sessions=["alice-s2"])
    assert report.deleted["feedback"] == 1 and report.deleted["rerankers"] == 4
    left = set(store.read("feedback", columns=["id"]).column("id").to_pylist())
    assert hit not in left and kept in left
    assert set(store.read("rerankers", columns=["id"]).column("id").to_pylist()) == {"rr-global-1", "rr-user:carol-1"}


def test_a_forget_killed_after_deleting_the_messages_leaves_no_pointer_to_them(
        canary_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed right after it deleted the messages, a forget is finished by the next one, which no
    longer sees those rows among its deletions: a fragment the forgotten turn had closed must be
    reopened all the same, as an uninterrupted forget does (it stayed closed by a row stored nowhere)."""
    def validity(store: Store) -> list[tuple[str, Any, Any]]:
        rows = store.read("fragments", "bob", columns=["id", "superseded_by", "valid_until"]).to_pylist()
        return sorted((r["id"], r["superseded_by"], r["valid_until"]) for r in rows)

    clean, s, _ = fresh(canary_store, tmp_path / "clean")
    forget(clean, s, "bob", sessions=["bob-s2"])
    killed, s2, _ = fresh(canary_store, tmp_path / "killed")
    real = Store.delete

    def dies_after_messages(self: Store, name: str, where: Any) -> None:
        real(self, name, where)
        if name == "messages":
            raise Killed("after deleting the messages")

    monkeypatch.setattr(Store, "delete", dies_after_messages)
    with pytest.raises(Killed):
        forget(killed, s2, "bob", sessions=["bob-s2"])
    monkeypatch.undo()
    forget(killed, s2, "bob", sessions=["bob-s2"])
    assert validity(killed) == validity(clean)
    stored = {r for name in ("messages", "fragments", "insights")
              for r in killed.read(name, "bob", columns=["id"]).column("id").to_pylist()}
    assert all(by in stored for _, by, _ in validity(killed) if by)


@pytest.mark.parametrize("before, after, says", [
    (1_000_000, 400_000, "purged: store 1,000,000 -> 400,000 bytes (600,000 reclaimed)"),
    (10_000, 11_731, "purged: store 10,000 -> 11,731 bytes (1,731 more: re-derived rows and rebuilt indices"),
])
def test_the_summary_says_what_the_store_size_did(before: int, after: int, says: str) -> None:
    report = ForgetReport(run_id="r", user_id="alice", scope={}, bytes_before=before, bytes_after=after, purged=True)
    assert says in report.summary() and report.to_dict()["bytes_reclaimed"] == before - after


def test_store_bytes_skip_a_file_removed_while_measured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The forget's before/after size walks the store while other writers work: a file removed between
    the listing and its stat (a writer's temporary file) counts 0 instead of failing the forget."""
    from memory import forget_purge

    (tmp_path / "t.lance").mkdir()
    (tmp_path / "t.lance" / "kept.bin").write_bytes(b"x" * 10)
    (tmp_path / "t.lance" / ".tmp-gone").write_bytes(b"y" * 5)
    real = os.stat

    def stat(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).endswith(".tmp-gone"):
            raise FileNotFoundError(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(forget_purge.os, "stat", stat)
    assert forget_purge.dir_bytes(str(tmp_path)) == 10
