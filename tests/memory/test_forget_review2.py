"""Forget against what a crash left (review 2): a user whose first consolidation died before its
watermark, a run that died after the watermark of an earlier one, the dead run's fragments of a
session gone since, and a forget killed midway that the next consolidation must finish, never undo."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
from lancedb.expr import col, lit

from memory.forget import forget
from memory.ingest import ingest
from memory.nightly import pending_users
from memory.runs import consolidate, open_store
from memory.settings import Settings
from memory.store import Store
from tests.helpers import Killed, copy_store, forget_killed_before_messages, killed_before
from tests.memory.test_forget import SESSION_CANARY, build, canary_archive, occurrences, provenance_ok

DERIVED = ("fragments", "insights", "topics", "summaries", "observations")


def citing(store: Store, session: str) -> dict[str, int]:
    """Rows of the derived tables that cite a message of `session` (ids are `<session>-mNN`)."""
    out = {}
    for name in DERIVED:
        if store.has_table(name):
            rows = store.read(name, columns=["source_ids"]).to_pylist()
            out[name] = sum(any(i.startswith(session + "-") for i in r["source_ids"] or []) for r in rows)
    return {k: v for k, v in out.items() if v}


def frags(store: Store) -> set[tuple[str, str]]:
    return {(r["id"], r["text"]) for r in store.read("fragments", columns=["id", "text"]).to_pylist()}


@pytest.fixture(scope="module")
def canary_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("forget-review2")
    build(tmp / "store", canary_archive(tmp / "canary.jsonl"))
    return tmp / "store"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """A fresh consolidation of the canary archive without alice-s2."""
    tmp = tmp_path_factory.mktemp("forget-review2-ref")
    return build(tmp / "ref", canary_archive(tmp / "rest.jsonl", drop_session="alice-s2"))[0]


def test_a_forget_after_a_first_run_died_before_its_watermark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              reference: Store) -> None:
    """No watermark: nothing of the user was committed. The forget deletes every derived row of the
    user (the dead run's, those citing the session among them), re-derives nothing, and the next run
    gives exactly a fresh consolidation of what remains."""
    s = Settings(store=str(tmp_path / "store"))
    store = open_store(s)
    ingest(store, canary_archive(tmp_path / "canary.jsonl"), "jsonl")
    with killed_before(monkeypatch, "watermarks"):
        consolidate(store, s)
    assert citing(store, "alice-s2") and store.read("watermarks").num_rows == 0
    report = forget(store, s, "alice", sessions=["alice-s2"])
    assert report.messages > 0 and report.deleted.get("fragments", 0) > 0
    assert citing(store, "alice-s2") == {}
    assert store.read("fragments", "alice").num_rows == 0          # every alice row was the dead run's
    assert store.read("fragments", "bob").num_rows > 0            # bob's are kept for the re-run to settle
    assert occurrences(tmp_path / "store", SESSION_CANARY) == 0
    provenance_ok(store, set())
    consolidate(store, s)
    assert citing(store, "alice-s2") == {}
    assert frags(store) == frags(reference)
    for name in ("insights", "clusters", "links", "topics", "summaries", "graph_nodes", "progress", "watermarks"):
        ids = [set(st.read(name, columns=["id"]).column("id").to_pylist()) for st in (store, reference)]
        assert ids[0] == ids[1], name


def test_a_rerun_deletes_the_dead_runs_fragments_of_a_session_gone_since(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         reference: Store) -> None:
    """Fragments are dated leftovers too: a session the dead run extracted and that is gone when the
    run is redone (its messages deleted) leaves no fragment behind; a plain re-run loses nothing."""
    s = Settings(store=str(tmp_path / "store"))
    store = open_store(s)
    ingest(store, canary_archive(tmp_path / "canary.jsonl"), "jsonl")
    with killed_before(monkeypatch, "watermarks"):
        consolidate(store, s)
    assert citing(store, "alice-s2").get("fragments")
    store.delete("messages", col("session_id") == lit("alice-s2"))
    store.delete("sessions", col("session_id") == lit("alice-s2"))
    consolidate(store, s)
    assert citing(store, "alice-s2") == {}
    assert frags(store) == frags(reference)


def test_a_forget_of_a_session_a_dead_run_consolidated_after_the_watermark(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The user has a watermark; a later run died before moving it, after writing the rows of newer
    sessions. Forgetting one of those rolls back to the watermark, never past it: the next run
    consolidates the other new sessions, as a run over the archive without the session does."""
    rows = [json.loads(line) for line in canary_archive(tmp_path / "all.jsonl").read_text().splitlines()]
    first = [r for r in rows if r["session_id"] in ("alice-s1", "bob-s1")]
    later = [r for r in rows if r not in first]

    def archive(name: str, part: list[dict[str, Any]]) -> Path:
        path = tmp_path / name
        path.write_text("\n".join(json.dumps(r) for r in part) + "\n")
        return path

    gone = "alice-s3"
    assert any(r["session_id"] == gone for r in later)
    s = Settings(store=str(tmp_path / "store"))
    store = open_store(s)
    ingest(store, archive("a.jsonl", first), "jsonl")
    consolidate(store, s)
    ingest(store, archive("b.jsonl", later), "jsonl")
    with killed_before(monkeypatch, "watermarks"):
        consolidate(store, s)
    assert citing(store, gone).get("fragments")
    forget(store, s, "alice", sessions=[gone])
    assert citing(store, gone) == {}
    consolidate(store, s)
    assert citing(store, gone) == {}
    ref_s = Settings(store=str(tmp_path / "ref"))
    ref = open_store(ref_s)
    ingest(ref, archive("ra.jsonl", first), "jsonl")
    consolidate(ref, ref_s)
    ingest(ref, archive("rb.jsonl", [r for r in later if r["session_id"] != gone]), "jsonl")
    consolidate(ref, ref_s)
    assert frags(store) == frags(ref)
    for name in ("insights", "clusters", "links", "topics", "summaries", "graph_nodes", "progress"):
        ids = [set(st.read(name, columns=["id"]).column("id").to_pylist()) for st in (store, ref)]
        assert ids[0] == ids[1], name
    wm = [{r["user_id"]: (r["last_session_ts"], r["sessions_done"]) for r in st.read("watermarks").to_pylist()}
          for st in (store, ref)]
    assert wm[0] == wm[1]


@pytest.fixture
def killed_forget(canary_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    """A copy of the canary store and a forget of alice-s2 killed after it deleted the derived rows,
    before it deleted the messages (its run stays `started`)."""
    store = copy_store(canary_store, tmp_path / "store")
    forget_killed_before_messages(monkeypatch, store, "alice", ["alice-s2"])
    assert store.read("runs", where=(col("kind") == lit("forget")) & (col("status") == lit("started"))).num_rows == 1
    assert store.read("messages", where=col("session_id") == lit("alice-s2")).num_rows > 0
    yield store


def test_the_next_consolidation_finishes_a_killed_forget(killed_forget: Store, tmp_path: Path,
                                                         reference: Store) -> None:
    """The nightly run finishes the forget first (its recorded scope), then consolidates: the
    forgotten session is not made memory again from its still stored messages."""
    store = killed_forget
    assert "alice" in pending_users(store)
    assert "alice" in pending_users(store, ["alice"]) and "alice" not in pending_users(store, ["bob"])
    consolidate(store, Settings(store=store.uri))
    assert citing(store, "alice-s2") == {}
    assert store.read("messages", where=col("session_id") == lit("alice-s2")).num_rows == 0
    assert occurrences(tmp_path / "store", SESSION_CANARY) == 0
    runs = store.read("runs", where=col("kind") == lit("forget")).to_pylist()
    assert [r["status"] for r in runs] == ["completed"]
    provenance_ok(store, set())
    assert frags(store) == frags(reference)


def test_a_run_of_other_users_leaves_a_killed_forget_to_its_user(killed_forget: Store) -> None:
    store = killed_forget
    consolidate(store, Settings(store=store.uri), ["bob"])
    runs = store.read("runs", where=col("kind") == lit("forget")).to_pylist()
    assert [r["status"] for r in runs] == ["started"]
    consolidate(store, Settings(store=store.uri), ["alice"])
    assert citing(store, "alice-s2") == {}


def test_the_next_consolidation_finishes_a_purge_a_crash_left(canary_store: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A forget whose deletes are written but whose purge died leaves the text in old versions: the
    next (nightly) consolidation, with nothing else to do, purges it first thing."""
    import memory.forget

    store = copy_store(canary_store, tmp_path / "store")

    def dies(*_: Any) -> None:
        raise Killed("purge")

    with monkeypatch.context() as m:
        m.setattr(memory.forget, "purge", dies)
        with pytest.raises(Killed):
            forget(store, Settings(store=store.uri), "alice", sessions=["alice-s2"])
    assert occurrences(tmp_path / "store", SESSION_CANARY) > 0        # deleted, still in old versions
    assert "alice" in pending_users(store)
    consolidate(store, Settings(store=store.uri))
    assert occurrences(tmp_path / "store", SESSION_CANARY) == 0
    runs = store.read("runs", where=col("kind") == lit("forget")).to_pylist()
    assert [r["status"] for r in runs] == ["completed"]
    assert pending_users(store) == []
