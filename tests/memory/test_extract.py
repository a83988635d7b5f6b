"""The extract stage keeps memory about the user: of the fragments sourced only from assistant turns
(`RetrievalSettings.assistant_speakers`) each turn keeps at most `Settings.assistant_fragments_per_turn`."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from memory.settings import RetrievalSettings
from memory.store import Store
from memory.text import turn_text
from tests.helpers import SAMPLE, ingest_and_consolidate


def _assistant_only(store: Store) -> tuple[Counter[tuple[str, ...]], int]:
    """(fragments citing only assistant turns, per cited turns; all fragments) over the store."""
    said = {(m["user_id"], m["message_id"]) for m in store.read("messages").to_pylist()
            if m["speaker"].lower() == "assistant"}
    frags = store.read("fragments").to_pylist()
    theirs = Counter(tuple(f["source_ids"]) for f in frags
                     if f["source_ids"] and all((f["user_id"], s) in said for s in f["source_ids"]))
    return theirs, len(frags)


REPLY = ("I think a Yamaha FG800 is a great first guitar for you. I have seen many beginners start with open chords. "
         "I would practice fifteen minutes every day before trying barre chords. I recommend a clip-on tuner from "
         "Snark because I find phone apps unreliable in noisy rooms.")


def _archive(tmp: Path) -> Path:
    """The sample plus one session with a long assistant reply full of first-person statements."""
    rows = [{"user_id": "alice", "session_id": "alice-s9", "message_id": f"alice-s9-m0{i}", "speaker": who,
             "text": text, "timestamp": f"2024-06-01T10:0{i}:00Z"}
            for i, (who, text) in enumerate([("Alice", "I just started learning guitar and I practice at night."),
                                             ("assistant", REPLY)])]
    path = tmp / "archive.jsonl"
    path.write_text(SAMPLE.read_text() + "".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_fragments_of_assistant_turns_are_capped_per_turn(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    every, n_every = _assistant_only(ingest_and_consolidate(tmp_path / "all", archive, assistant_fragments_per_turn=None))
    none, n_none = _assistant_only(ingest_and_consolidate(tmp_path / "none", archive, assistant_fragments_per_turn=0))
    one, n_one = _assistant_only(ingest_and_consolidate(tmp_path / "one", archive, assistant_fragments_per_turn=1))
    assert sum(every.values()) > 0 and max(every.values()) > 1      # the sample's replies make several
    assert not none and n_none == n_every - sum(every.values())    # the users' own fragments all stay
    assert set(one) == set(every) and max(one.values()) == 1       # the first of each reply kept
    assert n_one == n_none + len(every)


def test_no_assistant_speaker_keeps_everything(tmp_path: Path) -> None:
    store = ingest_and_consolidate(tmp_path / "s", SAMPLE, assistant_fragments_per_turn=0,
                                   retrieval=RetrievalSettings(assistant_speakers=()))
    assert sum(_assistant_only(store)[0].values()) > 0


def test_a_role_is_not_embedded_a_name_is() -> None:
    assert turn_text("assistant", "Try the FG800.") == "Try the FG800."
    assert turn_text("User", "I play guitar.") == "I play guitar."
    assert turn_text("Caroline", "I adopted a dog.") == "Caroline: I adopted a dog."
    assert turn_text(None, "hello") == "hello"


def test_relative_dates_are_read_in_the_speakers_time(tmp_path: Path) -> None:
    """"Yesterday", said at 23:32 on 10 February at UTC-8 (07:32 on the 11th in UTC), is the 9th: the
    timestamp's offset is stored with the turn and dates are read in it; a turn without an offset
    stays UTC."""
    rows = [{"user_id": "carol", "session_id": "s1", "message_id": "m1", "speaker": "Carol",
             "text": "Yesterday I submitted my cover letter to the Acme marketing job.",
             "timestamp": "2024-02-10T23:32:00-08:00"},
            {"user_id": "carol", "session_id": "s2", "message_id": "m2", "speaker": "Carol",
             "text": "Yesterday I booked the flights to Lisbon for the design conference.",
             "timestamp": "2024-03-10T23:32:00"}]
    archive = tmp_path / "carol.jsonl"
    archive.write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = ingest_and_consolidate(tmp_path / "store", archive, llm="rules")
    offsets = dict(zip(*store.read("messages", "carol", columns=["message_id", "utc_offset_min"]).to_pydict().values()))
    assert offsets == {"m1": -480, "m2": None}
    dates = {tuple(r["source_ids"]): r["date"] for r in store.read("fragments", "carol").to_pylist()}
    assert dates[("m1",)] == "2024-02-09" and dates[("m2",)] == "2024-03-09"
    stored = store.read("messages", "carol", columns=["message_id", "ts"]).to_pylist()
    assert {r["message_id"]: r["ts"].isoformat() for r in stored}["m1"] == "2024-02-11T07:32:00+00:00"   # UTC
