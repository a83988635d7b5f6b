"""A forget deletes what it forgets and nothing else, even where ids are paths: a session id holding a
`/` (its quarantined LLM work goes, a sibling session's stays), an appended turn's quarantine row (named
by its place in a batch, not by a session), the purge under the run lease, and citation feedback
written after a forget in another process deleted what it names."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

import memory.forget
from memory.forget import forget
from memory.ingest import append, ingest
from memory.lease import lease
from memory.settings import RetrievalSettings, Settings
from memory.stages.load import work_named
from memory.store import Store
from retrieval import Retriever
from retrieval.feedback import InvalidFeedbackError, read_feedback


def test_the_work_a_quarantine_row_names() -> None:
    known = {"trips", "trips/rome", "s1"}
    assert work_named("extract", "trips/rome", known) == ("extract", "trips/rome", "")
    assert work_named("topics", "trips/rome/CI/CD", known) == ("topics", "trips/rome", "CI/CD")
    assert work_named("topics", "trips/paris", known) == ("topics", "trips", "paris")
    assert work_named("topics", "s9/hiking", known) == ("topics", "s9", "hiking")   # an unknown session
    assert work_named("profile", "profile", known) == ("summarize", "", "")
    assert work_named("reason", "link-1", known) is None


def _quarantine(store: Store, user: str, stage: str, source: str, raw: str) -> str:
    qid = f"q-{stage}-{source}"
    store.upsert("quarantine", [{"id": qid, "user_id": user, "stage": stage, "source": source, "reason": "test",
                                 "raw": raw, "run_id": "t", "created_at": datetime.now(timezone.utc)}])
    return qid


def _quarantined(store: Store) -> set[str]:
    return set(store.read("quarantine", columns=["id"]).column("id").to_pylist())


def test_a_session_id_with_a_slash_takes_its_quarantined_work_along(sample_store: Store, tmp_path: Path) -> None:
    rows = [{"user_id": "alice", "session_id": sid, "message_id": f"{sid}-m1", "speaker": "Alice",
             "text": f"I loved the food in {sid}.", "timestamp": "2024-05-01T10:00:00Z"}
            for sid in ("trips", "trips/rome")]
    archive = tmp_path / "trips.jsonl"
    archive.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ingest(sample_store, archive, "jsonl")
    rome = {_quarantine(sample_store, "alice", "extract", "trips/rome", "ROME answer"),
            _quarantine(sample_store, "alice", "topics", "trips/rome/CI/CD", "ROME topic")}
    trips = {_quarantine(sample_store, "alice", "extract", "trips", "TRIPS answer"),
             _quarantine(sample_store, "alice", "topics", "trips/food", "TRIPS topic"),
             # subject "rome/pasta" of session "trips", or subject "pasta" of "trips/rome": either way it goes
             _quarantine(sample_store, "alice", "topics", "trips/rome/pasta", "TRIPS or ROME topic")}
    settings = Settings(store=sample_store.uri)
    assert forget(sample_store, settings, "alice", sessions=["trips"]).messages == 1
    # a topics row of a session nested under the forgotten one goes too: its source cannot tell "trips" +
    # "rome/CI/CD" from "trips/rome" + "CI/CD", and a forget keeps nothing that may quote what it forgets
    assert _quarantined(sample_store) & (rome | trips) == {"q-extract-trips/rome"}
    assert forget(sample_store, settings, "alice", sessions=["trips/rome"]).messages == 1
    assert not _quarantined(sample_store) & (rome | trips)


def test_an_appended_turns_quarantine_row_is_not_read_as_a_session(sample_store: Store) -> None:
    """Its source is `append:user/<index in the batch>`: forgetting session "1" leaves a bad turn of
    session "7" at index 1 alone; forgetting session "7" takes it."""
    turns = [{"session_id": "7", "message_id": "m-ok", "speaker": "Alice", "text": "I moved to Oslo.",
              "timestamp": "2024-06-01T10:00:00Z"},
             {"session_id": "7", "message_id": "m-bad", "speaker": "Alice", "text": "I sold my car.",
              "timestamp": "not a time"}]
    assert len(append(sample_store, "alice", turns).quarantined) == 1
    bad = _quarantined(sample_store)
    assert len(bad) == 1
    settings = Settings(store=sample_store.uri)
    forget(sample_store, settings, "alice", sessions=["1"])
    assert _quarantined(sample_store) == bad
    forget(sample_store, settings, "alice", sessions=["7"])
    assert not _quarantined(sample_store)


def test_the_purge_holds_the_run_lease(sample_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run waiting for the lease must not read a table the purge compacts and cleans meanwhile."""
    held: list[bool] = []
    real = memory.forget.purge

    def watched(store: Store, tables: Any) -> list[str]:
        held.append(lease(store.uri, "run").held())
        return real(store, tables)

    monkeypatch.setattr(memory.forget, "purge", watched)
    assert forget(sample_store, Settings(store=sample_store.uri), "alice", sessions=["alice-s2"]).purged
    assert held == [True]


def test_feedback_on_memories_forgotten_since_they_were_shown_is_refused(sample_store: Store) -> None:
    """The retriever's cached index still holds them (another process forgot them): the record is
    checked against the store under the write lease and refused, so nothing outlives the forget."""
    retriever = Retriever(sample_store, RetrievalSettings(refresh_ms=10**9))
    res = retriever.retrieve("alice", "what guitar did I buy?", k=5)
    doomed = [it.id for it in res.items if any(s.startswith("alice-s1-") for s in it.source_ids)]
    assert doomed
    forget(Store(sample_store.uri, dim=sample_store.dim), Settings(store=sample_store.uri), "alice",
           sessions=["alice-s1"])
    with pytest.raises(InvalidFeedbackError, match="no longer stored"):
        retriever.feedback("alice", "what guitar did I buy?", res.ids, doomed[:1])
    assert read_feedback(sample_store, "alice").num_rows == 0
    fresh = Retriever(sample_store, RetrievalSettings())
    kept = fresh.retrieve("alice", "what guitar did I buy?", k=5).ids
    assert fresh.feedback("alice", "what guitar did I buy?", kept, kept[:1])["shown"] == len(kept)
