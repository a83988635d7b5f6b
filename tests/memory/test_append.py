"""Appends (memory/ingest/append.py) on a real store: the same checks as ingest with reasons reported
back, idempotent by message id, a reused id with other text quarantined, a size limit; and the next
consolidation makes the appended turns memory, in new sessions and in already-consolidated ones."""
from __future__ import annotations

from typing import Any

import pytest
from lancedb.expr import col

from memory.errors import AppendTooLargeError, InvalidUserIdError
from memory.ingest import REUSED_ID, append
from memory.ingest.append import OTHER_USER, Compactor
from memory.runs import consolidate
from memory.settings import Settings
from memory.store import Store
from retrieval import Retriever


def turn(i: int, text: str | None = None, session: str = "carol-s1", **extra: Any) -> dict[str, Any]:
    return {"session_id": session, "message_id": f"{session}-m{i}", "speaker": "Carol",
            "text": text if text is not None else f"Carol says hello number {i}.",
            "timestamp": f"2024-06-01T10:{i:02d}:00Z", **extra}


def test_bad_turns_are_quarantined_with_their_reasons(store: Store) -> None:
    turns: list[Any] = [turn(0), turn(1, timestamp="soon"), {"session_id": "s", "speaker": "x", "text": "y",
                        "timestamp": "2024-06-01T10:00:00Z"}, "not a turn", turn(2, user_id="mallory"),
                        turn(3, text="a\x00b"), turn(4, text="x" * 1_000_001), turn(5), turn(5, text="other")]
    rep = append(store, "carol", turns)
    assert rep.received == 9 and rep.added == 2 and rep.sessions == ["carol-s1"]
    reasons = {q["index"]: q["reason"] for q in rep.quarantined}
    assert reasons == {1: "unparsable timestamp: 'soon'", 2: "missing field: message_id",
                       3: "invalid turn: not an object", 4: OTHER_USER, 5: "NUL character in text",
                       6: "text longer than 1000000 characters", 8: REUSED_ID}
    assert rep.quarantined[0]["message_id"] == "carol-s1-m1"
    stored = store.read("quarantine", "carol").to_pylist()
    assert sorted(q["reason"] for q in stored) == sorted(reasons.values())
    assert {r["message_id"] for r in store.read("messages", "carol").to_pylist()} == {"carol-s1-m0", "carol-s1-m5"}


def test_idempotent_by_message_id_and_reused_ids_quarantined(store: Store) -> None:
    batch = [turn(i) for i in range(5)]
    assert append(store, "carol", batch).added == 5
    again = append(store, "carol", batch)
    assert (again.added, again.duplicates, again.quarantined) == (0, 5, [])
    q_before = store.read("quarantine").num_rows
    changed = append(store, "carol", [turn(0, text="something else"), turn(5)])
    assert changed.added == 1 and [q["reason"] for q in changed.quarantined] == [REUSED_ID]
    assert store.read("quarantine").num_rows == q_before + 1
    msgs = store.read("messages", "carol", where=col("session_id") == "carol-s1").to_pylist()
    assert sorted(m["seq"] for m in msgs) == list(range(6))       # the later batch continues the session
    assert {m["message_id"]: m["text"] for m in msgs}["carol-s1-m0"] == "Carol says hello number 0."
    session = store.read("sessions", "carol").to_pylist()
    assert len(session) == 1 and session[0]["n_messages"] == 6


def test_limits(store: Store) -> None:
    with pytest.raises(AppendTooLargeError, match="at most 3 turns"):
        append(store, "carol", [turn(i) for i in range(4)], max_messages=3)
    with pytest.raises(InvalidUserIdError):
        append(store, "../etc", [turn(0)])
    assert not store.has_table("messages") or store.read("messages").num_rows == 0


def test_appended_turns_become_memory(sample_store: Store, embedder: Any) -> None:
    """New session of a consolidated user, and more turns of an already-consolidated session: the next
    run consolidates both (progress.next_seq), and retrieval finds them."""
    settings = Settings(store=sample_store.uri)
    new_session = [turn(0, "I just adopted a grey parrot named Kiwi from the shelter.", session="alice-s9",
                        speaker="Alice"),
                   turn(1, "That's wonderful, parrots are clever.", session="alice-s9", speaker="assistant")]
    for t in new_session:
        t["timestamp"] = t["timestamp"].replace("2024-06-01", "2024-05-01")
    old_session = [{"session_id": "alice-s1", "message_id": "alice-s1-m99", "speaker": "Alice",
                    "text": "Oh, and I also signed up for a pottery class at the community center.",
                    "timestamp": "2024-03-02T11:30:00Z"}]
    assert append(sample_store, "alice", new_session + old_session).added == 3
    report = consolidate(sample_store, settings)
    assert report.status == "completed"
    frags = sample_store.read("fragments", "alice", columns=["source_ids", "content"]).to_pylist()
    cited = {s for f in frags for s in f["source_ids"]}
    assert {"alice-s9-m0", "alice-s1-m99"} <= cited
    embedded = sample_store.read("messages", "alice", columns=["message_id", "vector"]).to_pylist()
    assert all(m["vector"] is not None for m in embedded)
    r = Retriever(sample_store, settings, embedder=embedder)
    hits = r.retrieve("alice", "What is the name of Alice's parrot?", k=5)
    assert any("alice-s9-m0" in it.source_ids for it in hits.items)
    again = consolidate(sample_store, settings)       # nothing left: a second run adds nothing
    assert again.counts.get("fragments", 0) == 0


def test_compactor_keeps_the_append_tables_compact(store: Store) -> None:
    comp = Compactor(store, every=4, min_fragments=2)
    for b in range(8):
        append(store, "carol", [turn(i, session=f"carol-b{b}") for i in range(3)])
        comp.appended()
    comp.join(timeout=60)
    files, _ = store.data_files()["messages"]
    assert files < 8                                            # one per batch without it
    assert store.read("messages", "carol").num_rows == 24      # nothing lost or doubled by the rewrite
    assert len(set(store.read("messages", "carol").column("id").to_pylist())) == 24


def test_an_append_reads_the_text_of_repeated_ids_only(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Appending to a long session reads its turns' seq, speaker and time, not their text: only the
    stored turns whose ids the batch repeats come with text (memory per append stays the batch's)."""
    assert append(store, "carol", [turn(i, session="carol-long") for i in range(40)]).added == 40
    real = Store.read
    texts: list[int] = []

    def spy(self: Store, name: str, *args: Any, **kwargs: Any) -> Any:
        out = real(self, name, *args, **kwargs)
        if name == "messages" and "text" in (kwargs.get("columns") or out.column_names):
            texts.append(out.num_rows)
        return out

    monkeypatch.setattr(Store, "read", spy)
    rep = append(store, "carol", [turn(0, session="carol-long"), turn(41, session="carol-long")])
    assert rep.added == 1 and rep.duplicates == 1
    assert texts and max(texts) <= 1, texts       # the repeated turn's text alone
    stored = store.read("messages", "carol", where=col("session_id") == "carol-long").to_pylist()
    assert sorted(r["seq"] for r in stored) == list(range(41))
