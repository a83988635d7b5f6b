"""A session has one time: a consolidated session keeps it when a turn dated before its first one
arrives later (an append, a re-ingest, doctor's repair of its row), so its fragments, clusters and
graph place agree; a session not yet consolidated still takes its earliest turn's time."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from lancedb.expr import col, lit

from memory.doctor import remake_sessions, session_mismatches
from memory.ids import make_id
from memory.ingest.append import append
from memory.ingest.write import consolidated_sessions
from memory.runs import consolidate
from memory.settings import Settings
from memory.stages import load
from memory.store import Store

SESSION = "alice-s1"                                   # first turn 2024-03-02T10:15:00Z
FIRST = datetime(2024, 3, 2, 10, 15, tzinfo=timezone.utc)
EARLY = {"session_id": SESSION, "message_id": "early-1", "speaker": "Alice", "timestamp": "2024-03-01T08:00:00Z",
         "text": "Before we start: I adopted a cat named Pixel and I moved to Lisbon last week."}


def _session_ts(store: Store, session: str = SESSION) -> Any:
    return {r["session_id"]: r["ts"] for r in store.read("sessions", "alice").to_pylist()}[session]


def _times(store: Store, table: str) -> set[Any]:
    return {r["session_ts"] for r in store.read(table, "alice", columns=["session_id", "session_ts"]).to_pylist()
            if r["session_id"] == SESSION}


def test_an_earlier_turn_appended_to_a_consolidated_session_keeps_its_time(sample_store: Store) -> None:
    assert consolidated_sessions(sample_store, [("alice", SESSION), ("alice", "nope"), ("bob", SESSION)]) \
        == {("alice", SESSION): FIRST}
    assert append(sample_store, "alice", [EARLY]).added == 1
    assert _session_ts(sample_store) == FIRST
    consolidate(sample_store, Settings(store=sample_store.uri))
    assert _times(sample_store, "fragments") == {FIRST} and _times(sample_store, "clusters") == {FIRST}
    cited = {s for r in sample_store.read("fragments", "alice", columns=["source_ids"]).to_pylist()
             for s in r["source_ids"]}
    assert "early-1" in cited                           # the turn itself is consolidated, with its own time
    early = [r for r in sample_store.read("messages", "alice").to_pylist() if r["message_id"] == "early-1"]
    assert early[0]["ts"] == datetime(2024, 3, 1, 8, tzinfo=timezone.utc)


def test_a_session_not_yet_consolidated_takes_its_earliest_turn(sample_store: Store) -> None:
    new = {"session_id": "alice-s9", "speaker": "Alice", "text": "Back from the trip, the guitar survived."}
    append(sample_store, "alice", [{**new, "message_id": "s9-2", "timestamp": "2024-05-02T09:00:00Z"}])
    append(sample_store, "alice", [{**new, "message_id": "s9-1", "timestamp": "2024-05-01T09:00:00Z"}])
    assert _session_ts(sample_store, "alice-s9") == datetime(2024, 5, 1, 9, tzinfo=timezone.utc)


def test_doctor_remakes_a_consolidated_sessions_row_with_its_time(sample_store: Store, tmp_path: Path) -> None:
    append(sample_store, "alice", [EARLY])
    row = [r for r in sample_store.read("sessions", "alice").to_pylist() if r["session_id"] == SESSION][0]
    sample_store.upsert("sessions", [{**row, "n_messages": 1}])     # a row out of step with its messages
    mismatched = session_mismatches(sample_store)
    assert [(m["session_id"], m["row"]) for m in mismatched] == [(SESSION, 1)]
    assert remake_sessions(sample_store, mismatched) == 1
    fixed = [r for r in sample_store.read("sessions", "alice").to_pylist() if r["session_id"] == SESSION][0]
    assert fixed["n_messages"] == row["n_messages"] and fixed["ts"] == FIRST


def test_an_earlier_turn_appended_while_a_run_consolidates_the_session(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The run loaded the session at its first turn's time; the append, between its load and its
    commit, found no progress row yet and moved the row: the commit gives the row its time back."""
    store = Store(str(tmp_path / "s"))
    turn = {"session_id": "s1", "speaker": "Alice"}
    append(store, "alice", [{**turn, "message_id": "m1", "timestamp": "2024-03-02T10:15:00Z",
                             "text": "I adopted a cat named Pixel last week."}])
    real = load.load_user

    def racing(st: Store, state: Any, user: str) -> None:
        real(st, state, user)
        append(Store(str(tmp_path / "s")), "alice", [{**turn, "message_id": "m0", "timestamp": "2024-03-01T08:00:00Z",
                                                      "text": "I play the guitar every evening."}])
    monkeypatch.setattr(load, "load_user", racing)
    consolidate(store, Settings(store=store.uri))
    monkeypatch.setattr(load, "load_user", real)
    assert _session_ts(store, "s1") == datetime(2024, 3, 2, 10, 15, tzinfo=timezone.utc)
    consolidate(store, Settings(store=store.uri))                 # the appended turn, in the same session
    times = {r["session_ts"] for r in store.read("fragments", "alice", columns=["session_ts"]).to_pylist()}
    assert times == {datetime(2024, 3, 2, 10, 15, tzinfo=timezone.utc)}
    assert {"m0", "m1"} <= {s for r in store.read("fragments", "alice", columns=["source_ids"]).to_pylist()
                            for s in r["source_ids"]}


def test_doctor_remakes_a_lost_row_of_a_consolidated_session_with_its_time(sample_store: Store) -> None:
    append(sample_store, "alice", [EARLY])
    sample_store.delete("sessions", col("id") == lit(make_id("alice", SESSION)))
    mismatched = session_mismatches(sample_store)
    assert [(m["session_id"], m["row"]) for m in mismatched] == [(SESSION, None)]
    remake_sessions(sample_store, mismatched)
    assert _session_ts(sample_store) == FIRST                     # from its progress row, not the early turn
