"""Ingest of LoCoMo, LongMemEval, JSONL and Parquet archives into a real LanceDB store:
counts, deterministic ids, idempotent re-ingest, quarantine with reasons, tenant scoping, input limits.
(BEAM: tests/memory/test_beam_ingest.py.)"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memory import schemas
from memory.errors import IngestError, InvalidUserIdError
from memory.ids import make_id, validate_user_id
from memory.ingest import FORMATS, MAX_ID_CHARS, MAX_TEXT_CHARS, IngestReport, ingest, read_archive
from memory.ingest.readers import NOT_A_LIST
from memory.store import Store
from tests.helpers import LOCOMO, SAMPLE, unique_ids

TABLES = ("messages", "sessions", "observations", "quarantine")
UTC = timezone.utc


def _row(user: str = "alice", session: str = "s1", mid: str = "m1", text: str = "hello",
         ts: str = "2024-05-01T10:00:00Z", **extra: Any) -> dict[str, Any]:
    return {"user_id": user, "session_id": session, "message_id": mid, "speaker": "Alice", "text": text,
            "timestamp": ts, **extra}


def _write_jsonl(path: Path, rows: list[dict[str, Any] | bytes]) -> Path:
    with path.open("wb") as fh:
        for r in rows:
            fh.write((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n")
    return path


def _counts(store: Store) -> dict[str, int]:
    return {name: store.read(name, columns=["id"]).num_rows for name in TABLES}


def _quarantine(store: Store) -> dict[str, dict[str, Any]]:
    """Quarantined rows by reason (each reason once in these tests)."""
    rows = store.read("quarantine").to_pylist()
    return {r["reason"]: r for r in rows}


# -- LoCoMo ------------------------------------------------------------------------------------
@pytest.mark.skipif(not LOCOMO.exists(), reason="LoCoMo dev split not available")
def test_locomo_counts_and_idempotent_reingest(store: Store) -> None:
    report = ingest(store, LOCOMO, "locomo")
    assert isinstance(report, IngestReport) and report.format == "locomo"
    assert report.archive == "locomo_dev5.json"
    assert report.users == ["conv-26", "conv-30", "conv-41", "conv-42", "conv-43"]
    assert report.messages_read == report.messages_added == 2760
    assert report.quarantined == 0 and report.observations == 0
    assert store.users() == report.users
    assert store.read("messages", columns=["id"]).num_rows == 2760
    assert store.read("sessions", columns=["id"]).num_rows == report.sessions == 128
    assert "messages" in report.summary() and "2760" in report.summary()

    msgs = {r["message_id"]: r for r in store.read("messages", "conv-26").to_pylist()}
    first = msgs["D1:1"]
    assert first["id"] == make_id("conv-26", "D1:1") and first["session_id"] == "session_1"
    assert first["seq"] == 0 and msgs["D1:2"]["seq"] == 1 and first["speaker"] == "Caroline"
    assert first["ts"] == datetime(2023, 5, 8, 13, 56, tzinfo=UTC) and first["archive"] == "locomo_dev5.json"
    assert first["vector"] is None
    assert msgs["D1:5"]["text"].endswith(
        " [shares an image: a photo of a dog walking past a wall with a painting of a woman]")
    s1 = [s for s in store.read("sessions", "conv-26").to_pylist() if s["session_id"] == "session_1"][0]
    assert s1["id"] == make_id("conv-26", "session_1") and s1["speakers"] == ["Caroline", "Melanie"]
    assert s1["n_messages"] == 18 and s1["observed"] is False

    before = _counts(store)
    versions = {name: store.version(name) for name in ("messages", "sessions")}
    again = ingest(store, LOCOMO, "locomo")
    assert again.messages_added == 0 and again.messages_read == 2760
    assert _counts(store) == before
    assert {name: store.version(name) for name in ("messages", "sessions")} == versions  # nothing rewritten
    runs = store.read("runs").to_pylist()
    assert len(runs) == 2 and {r["kind"] for r in runs} == {"ingest"}
    unique_ids(store)


@pytest.mark.skipif(not LOCOMO.exists(), reason="LoCoMo dev split not available")
def test_locomo_observations_import(store: Store) -> None:
    report = ingest(store, LOCOMO, "locomo", observations_as_fragments=True)
    assert report.observations > 1000 and report.quarantined == 0
    obs = store.read("observations").to_pylist()
    assert len(obs) == report.observations
    msg_ids = {(r["user_id"], r["session_id"], r["message_id"])
               for r in store.read("messages", columns=["user_id", "session_id", "message_id"]).to_pylist()}
    for o in obs:
        assert o["source_ids"] and all((o["user_id"], o["session_id"], s) in msg_ids for s in o["source_ids"])
        assert o["id"] == make_id(o["user_id"], o["session_id"], o["content"], *o["source_ids"])
    observed = {(s["user_id"], s["session_id"]) for s in store.read("sessions").to_pylist() if s["observed"]}
    assert observed == {(o["user_id"], o["session_id"]) for o in obs}
    before = _counts(store)
    assert ingest(store, LOCOMO, "locomo", observations_as_fragments=True).messages_added == 0
    assert _counts(store) == before


def test_locomo_small_file_quarantines_bad_observations_and_dates(tmp_path: Path, store: Store) -> None:
    sample = {
        "sample_id": "conv-x",
        "conversation": {
            "speaker_a": "Ann", "speaker_b": "Ben",
            "session_1_date_time": "10:37 am on 27 June, 2023",
            "session_1": [
                {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a cat yesterday!"},
                {"speaker": "Ben", "dia_id": "D1:2", "text": "Look at mine.", "blip_caption": "a photo of a dog"},
                {"speaker": "Ann", "dia_id": "D1:3", "text": "Cute!"},
            ],
            "session_2_date_time": "sometime in the summer-ish?",
            "session_2": [{"speaker": "Ann", "dia_id": "D2:1", "text": "Hi again"}],
        },
        "observation": {
            "session_1_observation": {
                "Ann": [["Ann adopted a cat.", "D1:1"], ["Ann likes pets.", ["D1:1", "D1:3", "D9:9"]],
                        ["Ann has a boat.", "D7:7"]],
                "Ben": [["Ben has a dog.", "D1:2"]],
            },
            "session_2_observation": [["Ann said hi.", "D2:1"]],     # not a mapping of speakers
        },
    }
    path = tmp_path / "mini_locomo.json"
    path.write_text(json.dumps([sample]))
    report = ingest(store, path, "locomo", observations_as_fragments=True)
    assert report.messages_read == 4 and report.messages_added == 3 and report.observations == 3
    assert report.reasons == {"unparsable timestamp: 'sometime in the summer-ish?'": 1,
                              "observation cites no message of its session": 1,
                              "malformed observation: not a mapping of speakers": 1}
    msgs = {r["message_id"]: r for r in store.read("messages", "conv-x").to_pylist()}
    assert msgs["D1:2"]["text"] == "Look at mine. [shares an image: a photo of a dog]"
    assert msgs["D1:1"]["ts"] == datetime(2023, 6, 27, 10, 37, tzinfo=UTC)
    obs = {o["content"]: o for o in store.read("observations", "conv-x").to_pylist()}
    assert obs["Ann likes pets."]["source_ids"] == ["D1:1", "D1:3"] and obs["Ben has a dog."]["subject"] == "Ben"
    q = _quarantine(store)
    assert "D7:7" in q["observation cites no message of its session"]["raw"]
    assert q["unparsable timestamp: 'sometime in the summer-ish?'"]["user_id"] == "conv-x"
    assert all(r["stage"] == "ingest" and r["source"].startswith("mini_locomo.json:") for r in q.values())



@pytest.mark.parametrize("when", ["yesterday", "May 20", "20", "3 days ago", "June 2023", "1690000000"])
def test_a_session_date_read_from_todays_clock_is_quarantined(tmp_path: Path, store: Store, when: str) -> None:
    """A LoCoMo session time that is not a whole date is unparsable, not read relative to the day of
    the ingest (dateparser's fallback made "yesterday" the day before the ingest, "May 20" this year's);
    a whole date written otherwise still reads."""
    sample = {"sample_id": "conv-y", "conversation": {
        "speaker_a": "Ann", "speaker_b": "Ben",
        "session_1_date_time": when, "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "Hi"}],
        "session_2_date_time": "27 June 2023, 10:37", "session_2": [{"speaker": "Ben", "dia_id": "D2:1", "text": "Yo"}]}}
    path = tmp_path / "dates_locomo.json"
    path.write_text(json.dumps([sample]))
    report = ingest(store, path, "locomo")
    assert report.reasons == {f"unparsable timestamp: {when!r}": 1}
    assert [(r["message_id"], r["ts"]) for r in store.read("messages", "conv-y").to_pylist()] == \
        [("D2:1", datetime(2023, 6, 27, 10, 37, tzinfo=UTC))]

# -- LongMemEval ---------------------------------------------------------------------------------
def test_longmemeval(tmp_path: Path, store: Store) -> None:
    items = [
        {"question_id": "q1", "question": "What car do I drive?", "answer": "a Prius",
         "haystack_session_ids": ["sess_a", "sess_b"],
         "haystack_dates": ["2023/05/20 (Sat) 02:21", "2023/05/22 (Mon) 14:05"],
         "haystack_sessions": [
             [{"role": "user", "content": "I just bought a Prius."},
              {"role": "assistant", "content": "Nice! Hybrids are efficient.", "has_answer": True}],
             [{"role": "user", "content": "Where should I go hiking?"},
              {"role": "assistant", "content": "Try the coastal trail."},
              {"role": "user", "content": "Thanks!"}],
         ]},
        {"question_id": "q2", "haystack_session_ids": ["sess_a"], "haystack_dates": ["2023/06/01 (Thu) 09:00"],
         "haystack_sessions": [[{"role": "user", "content": "I love jazz."}, {"role": "assistant"}]]},
        {"question_id": "q3", "haystack_session_ids": 7, "haystack_dates": ["2023/06/01 (Thu) 09:00"],
         "haystack_sessions": [[{"role": "user", "content": "lost"}]]},
        {"question_id": "q4", "haystack_session_ids": ["s"], "haystack_dates": {"0": "2023/06/01 (Thu) 09:00"},
         "haystack_sessions": [[{"role": "user", "content": "lost"}]]},
    ]
    path = tmp_path / "lme.json"
    path.write_text(json.dumps(items))
    report = ingest(store, path, "longmemeval")
    assert report.users == ["q1", "q2"] and report.sessions == 3
    assert report.messages_read == 9 and report.messages_added == 6   # an item quarantined counts as one read
    assert report.reasons == {"missing field: content": 1,       # the malformed items quarantined, the rest in
                              "invalid field: haystack_session_ids is not a list": 1,
                              "invalid field: haystack_dates is not a list": 1}
    q1 = {r["message_id"]: r for r in store.read("messages", "q1").to_pylist()}
    assert set(q1) == {"sess_a:0", "sess_a:1", "sess_b:0", "sess_b:1", "sess_b:2"}
    assert q1["sess_a:1"]["speaker"] == "assistant" and q1["sess_b:2"]["seq"] == 2
    assert q1["sess_b:0"]["ts"] == datetime(2023, 5, 22, 14, 5, tzinfo=UTC)
    q2 = store.read("messages", "q2").to_pylist()
    assert [r["text"] for r in q2] == ["I love jazz."]  # same session id, other user: separate rows
    assert ingest(store, path, "longmemeval").messages_added == 0


# -- JSONL ------------------------------------------------------------------------------------
def test_jsonl_bad_rows_are_quarantined_with_reasons(tmp_path: Path, store: Store) -> None:
    good = [_row(mid="m1", ts="2024-05-01T10:00:00Z"),
            _row(mid="m2", ts="2024-05-01T12:00:00+02:00", text="naive and offset times become UTC"),
            {k: v for k, v in _row(mid="m3", ts="2024-05-01T10:05:00").items() if k != "speaker"}
            | {"role": "user"},
            _row(user="bob", mid="m1", text="bob's line")]
    missing_text = {k: v for k, v in _row(mid="m4").items() if k != "text"}
    bad: list[dict[str, Any] | bytes] = [
        b'{"user_id": "alice", "session_id": "s1", "message_id": "m5", "text": "caf\xe9", "speaker": "A"}',
        b'{"user_id": "alice", "session_id": "s1", "message_id": "m6", oops',
        missing_text,
        _row(mid="m7", ts="last tuesday"),
        _row(mid="m10", ts="0001-01-01T00:00:00+01:00"),     # valid ISO 8601, before year 1 in UTC
        b'{"user_id": "alice", "session_id": "s1", "message_id": "m8", "speaker": "Alice", '
        b'"text": "broken \\ud800 half", "timestamp": "2024-05-01T10:00:00Z"}',
        _row(user="eve'; DROP TABLE messages; --", mid="m9"),
        b"[1, 2, 3]",
    ]
    path = _write_jsonl(tmp_path / "mixed.jsonl", good + bad + [b"", b"   "])
    report = ingest(store, path, "jsonl")
    assert report.messages_read == len(good) + len(bad) and report.messages_added == len(good)
    assert report.users == ["alice", "bob"] and report.quarantined == len(bad)
    assert report.reasons == {
        "bad encoding": 1, "invalid json": 1, "missing field: text": 1,
        "unparsable timestamp: 'last tuesday'": 1, "lone surrogate in text": 1,
        "unparsable timestamp: '0001-01-01T00:00:00+01:00'": 1, "invalid user_id": 1,
        "invalid json: not an object": 1,
    }
    assert report.summary().count(": 1") == 5 and "+3 more reasons (3 rows)" in report.summary()  # all 8 counted
    q = _quarantine(store)
    assert q["bad encoding"]["raw"].endswith('"text": "caf\ufffd", "speaker": "A"}')
    assert q["bad encoding"]["user_id"] is None and q["bad encoding"]["source"] == "mixed.jsonl:line 5"
    assert q["invalid json"]["raw"].endswith("oops")
    assert q["missing field: text"]["user_id"] == "alice"
    assert json.loads(q["missing field: text"]["raw"]) == missing_text
    assert "\\ud800" in q["lone surrogate in text"]["raw"]
    assert q["invalid user_id"]["user_id"] is None and "DROP TABLE" in q["invalid user_id"]["raw"]
    for r in q.values():
        owner = [r["user_id"]] if r["user_id"] is not None else []   # a row of a user: its id names the user
        assert r["id"] == make_id(*owner, r["source"], r["reason"], r["raw"]) and r["stage"] == "ingest"
        assert r["run_id"] == report.run_id

    alice = {r["message_id"]: r for r in store.read("messages", "alice").to_pylist()}
    assert set(alice) == {"m1", "m2", "m3"}
    assert alice["m2"]["ts"] == datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
    assert alice["m3"]["ts"] == datetime(2024, 5, 1, 10, 5, tzinfo=UTC) and alice["m3"]["speaker"] == "user"
    # seq follows time (m1 and m2 tie at 10:00 and keep file order)
    assert [alice[m]["seq"] for m in ("m1", "m2", "m3")] == [0, 1, 2]
    session = store.read("sessions", "alice").to_pylist()[0]
    assert session["ts"] == datetime(2024, 5, 1, 10, 0, tzinfo=UTC) and session["n_messages"] == 3
    assert session["speakers"] == ["Alice", "user"]

    before = _counts(store)
    again = ingest(store, path, "jsonl")
    assert again.messages_added == 0 and again.quarantined == len(bad)
    assert _counts(store) == before  # quarantine rows not duplicated
    unique_ids(store)


def test_sample_archive_is_clean(store: Store) -> None:
    report = ingest(store, SAMPLE, "jsonl")
    assert report.users == ["alice", "bob"] and report.quarantined == 0
    assert report.sessions >= 6 and report.messages_added == report.messages_read >= 40
    for s in store.read("sessions").to_pylist():
        assert 6 <= s["n_messages"] <= 10 and "assistant" in s["speakers"]


# -- Parquet ----------------------------------------------------------------------------------
def test_parquet(tmp_path: Path, store: Store) -> None:
    table = pa.table({
        "user_id": ["alice", "alice", "alice", "bob", None],
        "session_id": ["s1", "s1", "s1", "s9", "s1"],
        "message_id": ["m1", "m2", "m3", "m1", "m4"],
        "role": ["user", "assistant", "user", "user", "user"],
        "text": ["I moved to Berlin.", "How do you like it?", None, "hi", "orphan"],
        "timestamp": ["2024-02-01T09:00:00Z", "2024-02-01T09:01:00Z", "2024-02-01T09:02:00Z",
                      "not a date", "2024-02-01T09:03:00Z"],
    })
    path = tmp_path / "chats.parquet"
    pq.write_table(table, path)
    report = ingest(store, path, "parquet")
    assert report.messages_read == 5 and report.messages_added == 2 and report.users == ["alice"]
    assert report.reasons == {"missing field: text": 1, "unparsable timestamp: 'not a date'": 1,
                              "missing field: user_id": 1}
    rows = store.read("messages", "alice").to_pylist()
    assert sorted((r["message_id"], r["speaker"], r["seq"]) for r in rows) == [("m1", "user", 0),
                                                                               ("m2", "assistant", 1)]
    assert _quarantine(store)["missing field: text"]["source"] == "chats.parquet:row 2"

    native = pa.table({"user_id": ["carol"], "session_id": ["s1"], "message_id": ["m1"], "speaker": ["Carol"],
                       "text": ["native time"],
                       "timestamp": pa.array([datetime(2024, 3, 1, 8, 0)], pa.timestamp("us"))})
    pq.write_table(native, tmp_path / "native.parquet")
    assert ingest(store, tmp_path / "native.parquet", "parquet").messages_added == 1
    assert store.read("messages", "carol").to_pylist()[0]["ts"] == datetime(2024, 3, 1, 8, 0, tzinfo=UTC)

    pq.write_table(table.drop(["text"]), tmp_path / "no_text.parquet")
    with pytest.raises(IngestError, match="text"):
        ingest(store, tmp_path / "no_text.parquet", "parquet")


# -- ids, duplicates, tenants, errors -----------------------------------------------------------
def test_reused_message_id_in_file_and_across_ingests(tmp_path: Path, store: Store) -> None:
    first = _write_jsonl(tmp_path / "a.jsonl", [
        _row(mid="m1", text="I work at Acme."),
        _row(mid="m1", text="I work at Acme."),                      # exact duplicate: no-op
        _row(mid="m1", text="I work at Globex."),                    # same id, other text
        _row(mid="m2", text="I like tea.", ts="2024-05-01T10:01:00Z"),
    ])
    report = ingest(store, first, "jsonl")
    assert report.messages_read == 4 and report.messages_added == 2
    assert report.reasons == {"reused message id with other text": 1}
    q = _quarantine(store)["reused message id with other text"]
    assert "Globex" in q["raw"] and q["user_id"] == "alice"

    second = _write_jsonl(tmp_path / "b.jsonl", [
        _row(mid="m2", text="I like tea.", ts="2024-05-01T10:01:00Z"),   # already stored, same text
        _row(mid="m1", text="I work at Initech."),                       # already stored, other text
        _row(mid="m3", text="I got a cat.", ts="2024-05-01T10:02:00Z"),  # new, same session
    ])
    report = ingest(store, second, "jsonl")
    assert report.messages_added == 1 and report.reasons == {"reused message id with other text": 1}
    alice = {r["message_id"]: r for r in store.read("messages", "alice").to_pylist()}
    assert alice["m1"]["text"] == "I work at Acme." and alice["m1"]["archive"] == "a.jsonl"
    assert alice["m3"]["seq"] == 2 and alice["m3"]["archive"] == "b.jsonl"  # continues the stored session
    session = store.read("sessions", "alice").to_pylist()
    assert len(session) == 1 and session[0]["n_messages"] == 3
    assert store.read("quarantine", columns=["id"]).num_rows == 2
    unique_ids(store)



def test_a_later_ingest_reads_only_what_it_touches_yet_sees_reused_ids_in_other_sessions(
        tmp_path: Path, store: Store) -> None:
    """Stored messages are read by the batch's ids and sessions: an id reused in another session
    is still caught, and the untouched session keeps its rows and its session row."""
    ingest(store, _write_jsonl(tmp_path / "a.jsonl", [
        _row(session="s1", mid="m1", text="I work at Acme."),
        _row(session="s2", mid="m2", text="I like tea.", ts="2024-05-02T10:00:00Z")]), "jsonl")
    report = ingest(store, _write_jsonl(tmp_path / "b.jsonl", [
        _row(session="s3", mid="m1", text="I work at Globex.", ts="2024-05-03T10:00:00Z"),
        _row(session="s2", mid="m4", text="Green tea.", ts="2024-05-02T10:05:00Z")]), "jsonl")
    assert report.messages_added == 1 and report.reasons == {"reused message id with other text": 1}
    rows = {r["message_id"]: r for r in store.read("messages", "alice").to_pylist()}
    assert rows["m1"]["session_id"] == "s1" and rows["m1"]["text"] == "I work at Acme."
    assert rows["m4"]["seq"] == 1                                    # after m2 in s2
    sessions = {r["session_id"]: r["n_messages"] for r in store.read("sessions", "alice").to_pylist()}
    assert sessions == {"s1": 1, "s2": 2}
    unique_ids(store)

def test_tenants_never_mix(tmp_path: Path, store: Store) -> None:
    path = _write_jsonl(tmp_path / "two.jsonl", [
        _row(user="user-a", mid="m1", text="A's secret"),
        _row(user="user-b", mid="m1", text="B's secret"),   # same session and message id, other user
    ])
    report = ingest(store, path, "jsonl")
    assert report.messages_added == 2 and report.quarantined == 0
    a = store.read("messages", "user-a").to_pylist()
    b = store.read("messages", "user-b").to_pylist()
    assert [r["text"] for r in a] == ["A's secret"] and [r["text"] for r in b] == ["B's secret"]
    assert a[0]["id"] != b[0]["id"]
    assert {r["user_id"] for r in store.read("sessions", "user-a").to_pylist()} == {"user-a"}
    assert store.read("messages", "user-c").num_rows == 0


def test_unknown_format_and_missing_file(tmp_path: Path, store: Store) -> None:
    path = _write_jsonl(tmp_path / "x.jsonl", [_row()])
    with pytest.raises(IngestError) as err:
        ingest(store, path, "csv")
    assert all(name in str(err.value) for name in FORMATS)
    with pytest.raises(IngestError, match="not found"):
        ingest(store, tmp_path / "nope.jsonl", "jsonl")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    with pytest.raises(IngestError):
        read_archive(bad_json, "locomo")
    assert not store.has_table("messages")


def test_rows_match_schemas(tmp_path: Path, store: Store) -> None:
    batch = read_archive(SAMPLE, "jsonl")
    assert batch.observations.height == 0 and batch.quarantine == []
    ingest(store, SAMPLE, "jsonl", run_id="ingest-test")
    for name in ("messages", "sessions", "runs"):
        got = store.read(name).schema
        want = schemas.schema_for(name, 384)
        assert [(f.name, f.type) for f in got] == [(f.name, f.type) for f in want], name
    run = store.read("runs").to_pylist()[0]
    assert run["id"] == "ingest-test" and run["kind"] == "ingest" and run["users"] == ["alice", "bob"]
    assert json.loads(run["counts_json"])["messages_added"] == batch.messages.height


# -- input limits and shapes (issue 16) ---------------------------------------------------------
@pytest.mark.parametrize("bad", ["alice\n", "alice\r\n", "\nalice", "alice\x00", "", "-alice", "a" * 129])
def test_user_id_must_match_whole(bad: str) -> None:
    with pytest.raises(InvalidUserIdError):
        validate_user_id(bad)
    assert validate_user_id("alice") == "alice" and validate_user_id("a" * 128) == "a" * 128


def test_user_id_with_trailing_newline_is_quarantined_not_a_new_user(tmp_path: Path, store: Store) -> None:
    path = _write_jsonl(tmp_path / "nl.jsonl", [_row(mid="m1"), _row(user="alice\n", mid="m2", text="other")])
    report = ingest(store, path, "jsonl")
    assert report.users == ["alice"] and report.messages_added == 1
    assert report.reasons == {"invalid user_id": 1}
    row = _quarantine(store)["invalid user_id"]
    assert row["user_id"] is None and json.loads(row["raw"])["user_id"] == "alice\n"
    assert store.users() == ["alice"]
    assert [r["message_id"] for r in store.read("messages", "alice").to_pylist()] == ["m1"]


def test_a_session_that_is_not_a_list_is_quarantined(tmp_path: Path, store: Store) -> None:
    locomo = [{"sample_id": "conv-y", "conversation": {
        "session_1_date_time": "10:37 am on 27 June, 2023",
        "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "Hello"}],
        "session_2_date_time": "10:37 am on 28 June, 2023",
        "session_2": {"speaker": "Ann", "dia_id": "D2:1", "text": "not in a list"}}}]
    path = tmp_path / "loco.json"
    path.write_text(json.dumps(locomo))
    report = ingest(store, path, "locomo")
    assert report.messages_added == 1 and report.reasons == {NOT_A_LIST: 1}
    row = _quarantine(store)[NOT_A_LIST]
    assert row["user_id"] == "conv-y" and row["source"] == "loco.json:conv-y/session_2"
    assert json.loads(row["raw"])["text"] == "not in a list"

    late = [{"sample_id": "conv-z", "conversation": {     # its time zone moves it past year 9999
        "session_1_date_time": "11:30 pm on 31 December, 9999 EST",
        "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "Hello"}]}}]
    path.write_text(json.dumps(late))
    assert read_archive(path, "locomo").quarantine[0]["reason"].startswith("unparsable timestamp")

    lme = [{"question_id": "q9", "haystack_session_ids": ["a", "b"],
            "haystack_dates": ["2023/05/20 (Sat) 02:21", "2023/05/21 (Sun) 02:21"],
            "haystack_sessions": [[{"role": "user", "content": "hi"}], "a string, not a list"]}]
    path = tmp_path / "lme.json"
    path.write_text(json.dumps(lme))
    batch = read_archive(path, "longmemeval")
    assert batch.messages.height == 1
    assert [(q["reason"], q["source"], q["user_id"]) for q in batch.quarantine] == [(NOT_A_LIST, "lme.json:q9/b", "q9")]


def test_length_limits_and_nul_are_quarantined(tmp_path: Path, store: Store) -> None:
    longest = "x" * MAX_TEXT_CHARS
    rows: list[dict[str, Any] | bytes] = [
        _row(mid="ok", text=longest), _row(session="s" * MAX_ID_CHARS, mid="m" * MAX_ID_CHARS),
        _row(mid="long-text", text=longest + "x"),
        _row(session="s" * (MAX_ID_CHARS + 1), mid="long-session"),
        _row(mid="m" * (MAX_ID_CHARS + 1)),
        _row(mid="nul", text="before\x00after"),
        _row(mid="nul-id\x00"),
    ]
    report = ingest(store, _write_jsonl(tmp_path / "limits.jsonl", rows), "jsonl")
    assert report.messages_added == 2
    assert report.reasons == {f"text longer than {MAX_TEXT_CHARS} characters": 1,
                              f"session_id longer than {MAX_ID_CHARS} characters": 1,
                              f"message_id longer than {MAX_ID_CHARS} characters": 1,
                              "NUL character in text": 1, "NUL character in message_id": 1}
    assert all(q["user_id"] == "alice" for q in _quarantine(store).values())
    kept = {r["message_id"]: r for r in store.read("messages", "alice").to_pylist()}
    assert set(kept) == {"ok", "m" * MAX_ID_CHARS} and kept["ok"]["text"] == longest


def test_an_unreadable_archive_is_one_clear_error(tmp_path: Path, store: Store,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write_jsonl(tmp_path / "locked.jsonl", [_row(mid="m1")])

    def denied(self: Path, *args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "open", denied)
    with pytest.raises(IngestError, match="cannot read .*locked.jsonl: Permission denied"):
        ingest(store, path, "jsonl")
    monkeypatch.undo()
    assert not store.has_table("messages") or store.read("messages").num_rows == 0


def test_a_directory_is_reported_as_a_directory(tmp_path: Path, store: Store) -> None:
    folder = tmp_path / "archive.jsonl"
    folder.mkdir()
    for fmt in ("jsonl", "parquet", "locomo", "longmemeval"):
        with pytest.raises(IngestError, match="is a directory") as err:
            ingest(store, folder, fmt)
        assert "not found" not in str(err.value) and fmt in str(err.value)
    with pytest.raises(IngestError, match="not found"):
        ingest(store, tmp_path / "missing", "beam")
    with pytest.raises(IngestError, match="format beam only"):
        ingest(store, _write_jsonl(tmp_path / "x.jsonl", [_row()]), "jsonl", user_id="alice")
    assert not store.has_table("messages")
