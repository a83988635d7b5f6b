"""Ingest defects a review found: a nanosecond Parquet timestamp, a zero-padded LoCoMo session key, a
BEAM batch quarantined for two users, a Parquet date column."""
from __future__ import annotations

import json
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lancedb.expr import col, lit

from memory.forget import forget
from memory.ids import make_id
from memory.ingest import ingest, ingest_batch, read_archive
from memory.ingest.common import parse_stamp, quarantine_row
from memory.settings import Settings
from memory.store import Store
from tests.helpers import LOCOMO

UTC = timezone.utc
BASE_NS = 1_710_052_200_000_000_000          # 2024-03-10T06:30:00Z


def _table(n: int, timestamp: pa.Array) -> pa.Table:
    return pa.table({"user_id": ["u1"] * n, "session_id": ["s1"] * n, "message_id": [f"m{i}" for i in range(n)],
                     "speaker": ["A"] * n, "text": [f"t{i}" for i in range(n)], "timestamp": timestamp})


# -- 1: a nanosecond timestamp column ----------------------------------------------------------
def test_parquet_nanosecond_timestamps_are_floored_to_microseconds(tmp_path: Path, store: Store) -> None:
    n = 1000
    stamps = [BASE_NS + i * 60_000_000_000 for i in range(n)]
    stamps[500] += 1                                  # 1 ns off a microsecond: no longer kills the ingest
    path = tmp_path / "ns.parquet"
    pq.write_table(_table(n, pa.array(stamps, pa.timestamp("ns", tz="UTC"))), path)
    report = ingest(store, path, "parquet")
    assert report.messages_read == report.messages_added == n and report.quarantined == 0
    got = {r["message_id"]: r["ts"] for r in store.read("messages", "u1", columns=["message_id", "ts"]).to_pylist()}
    start = datetime(2024, 3, 10, 6, 30, tzinfo=UTC)
    assert all(got[f"m{i}"] == start + timedelta(minutes=i) for i in range(n))

    # the time zone is kept (its offset recorded); sub-microsecond digits are floored, as the ISO
    # string "1969-12-31T23:59:59.999999999Z" is read, also before 1970
    ny = tmp_path / "ny.parquet"
    pq.write_table(_table(2, pa.array([BASE_NS + 123_456_789, -1], pa.timestamp("ns", tz="America/New_York"))), ny)
    batch = read_archive(ny, "parquet")
    rows = {r["message_id"]: r for r in batch.messages.to_dicts()}
    assert rows["m0"]["ts"] == datetime(2024, 3, 10, 6, 30, 0, 123456, tzinfo=UTC)
    assert rows["m0"]["utc_offset_min"] == -300          # 01:30 EST
    assert rows["m1"]["ts"] == datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert parse_stamp("1969-12-31T23:59:59.999999999+00:00") == (rows["m1"]["ts"], 0)


# -- 2: LoCoMo session keys as written ---------------------------------------------------------
def _turn(dia: str, text: str) -> dict[str, Any]:
    return {"speaker": "Ann", "dia_id": dia, "text": text}


def test_locomo_zero_padded_session_keys(tmp_path: Path, store: Store) -> None:
    samples = [
        {"sample_id": "conv-x", "conversation": {
            "session_01": [_turn("D1:1", "hi"), _turn("D1:2", "there")],
            "session_01_date_time": "1:56 pm on 8 May, 2023",
            "session_2": [_turn("D2:1", "later")], "session_2_date_time": "2:00 pm on 9 May, 2023",
            "session_10": [_turn("D10:1", "last")], "session_10_date_time": "2:00 pm on 10 May, 2023"}},
        {"sample_id": "conv-y", "conversation": {
            "session_1": [_turn("D1:1", "hello")], "session_1_date_time": "1:56 pm on 8 May, 2023"}},
    ]
    path = tmp_path / "padded.json"
    path.write_text(json.dumps(samples))
    report = ingest(store, path, "locomo")
    assert report.users == ["conv-x", "conv-y"] and report.messages_added == 5 and report.quarantined == 0
    sessions = {(r["user_id"], r["session_id"]): r["ts"] for r in store.read("sessions").to_pylist()}
    assert sessions == {("conv-x", "session_01"): datetime(2023, 5, 8, 13, 56, tzinfo=UTC),
                        ("conv-x", "session_2"): datetime(2023, 5, 9, 14, 0, tzinfo=UTC),
                        ("conv-x", "session_10"): datetime(2023, 5, 10, 14, 0, tzinfo=UTC),
                        ("conv-y", "session_1"): datetime(2023, 5, 8, 13, 56, tzinfo=UTC)}


@pytest.mark.skipif(not LOCOMO.exists(), reason="LoCoMo dev split not available")
def test_locomo_session_ids_unchanged() -> None:
    batch = read_archive(LOCOMO, "locomo")
    data = json.loads(LOCOMO.read_text())
    want = {(s["sample_id"], k) for s in data for k, v in s["conversation"].items()
            if isinstance(v, list) and k.startswith("session_")}
    assert set(batch.sessions.select("user_id", "session_id").iter_rows()) == want
    assert all(sid == f"session_{int(sid.removeprefix('session_'))}" for _, sid in want)
    first = batch.messages.filter(user_id="conv-26", message_id="D1:1").to_dicts()[0]
    assert first["id"] == make_id("conv-26", "D1:1") and first["session_id"] == "session_1"


# -- 3: a BEAM batch quarantined for each user it is ingested for --------------------------------
def test_beam_batch_quarantine_belongs_to_each_user(tmp_path: Path, store: Store) -> None:
    chat = [{"batch_number": 1, "turns": [[{"role": "user", "id": 1, "content": "hi", "time_anchor": "March-15-2024"},
                                           {"role": "assistant", "id": 2, "content": "hello"}]]},
            {"batch_number": "2", "turns": [[{"role": "user", "id": 3, "content": "bad batch"}]]}]
    path = tmp_path / "100K" / "1" / "chat.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(chat))
    for user in ("alice", "bob"):
        report = ingest(store, path, "beam", user_id=user)
        assert report.messages_added == 2 and report.reasons == {"missing field: batch_number": 1}
    rows = store.read("quarantine", columns=["user_id", "source", "reason"]).to_pylist()
    assert sorted((r["user_id"], r["source"]) for r in rows) == [("alice", "100K/1/chat.json:alice/batch 1"),
                                                                 ("bob", "100K/1/chat.json:bob/batch 1")]
    for user in ("alice", "bob"):                      # re-ingest for the same user adds nothing
        ingest(store, path, "beam", user_id=user)
    assert store.read("quarantine", columns=["id"]).num_rows == 2

    forget(store, Settings(store=store.uri), "bob")
    assert [r["user_id"] for r in store.read("quarantine", columns=["user_id"]).to_pylist()] == ["alice"]


def test_identical_bad_rows_of_two_users_are_two_rows(tmp_path: Path, store: Store) -> None:
    path = tmp_path / "ok.jsonl"
    path.write_text("")
    batch = read_archive(path, "jsonl")
    batch.quarantine = [quarantine_row(user, "chat.json:batch 0", "missing field: batch_number", '{"turns": []}')
                        for user in ("alice", "bob")]
    assert ingest_batch(store, batch).quarantined == 2
    assert sorted(store.read("quarantine", columns=["user_id"]).column("user_id").to_pylist()) == ["alice", "bob"]
    assert [r["user_id"] for r in store.read("quarantine", "bob").to_pylist()] == ["bob"]
    ingest_batch(store, batch)                        # again: nothing added
    assert store.read("quarantine", columns=["id"]).num_rows == 2


def test_quarantine_rows_of_an_older_version_are_not_added_again(tmp_path: Path, store: Store) -> None:
    """A row stored under the id of a version whose ids named no user is the same row for that user."""
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"user_id": "alice", "session_id": "s1", "message_id": "m1", "speaker": "A",
                                "timestamp": "2024-05-01T10:00:00Z"}) + "\n")
    ingest(store, path, "jsonl")
    (row,) = store.read("quarantine").to_pylist()
    assert row["id"] == make_id("alice", row["source"], row["reason"], row["raw"])
    store.delete("quarantine", col("id") == lit(row["id"]))
    store.upsert("quarantine", [{**row, "id": make_id(row["source"], row["reason"], row["raw"])}])
    assert ingest(store, path, "jsonl").quarantined == 1
    assert store.read("quarantine", columns=["id"]).num_rows == 1


# -- 4: a Parquet date column ------------------------------------------------------------------
@pytest.mark.parametrize("kind", [pa.date32(), pa.date64()])
def test_parquet_date_column_is_midnight_utc(tmp_path: Path, store: Store, kind: pa.DataType) -> None:
    path = tmp_path / "date.parquet"
    pq.write_table(_table(2, pa.array([date(2024, 3, 10), date(2024, 3, 11)], kind)), path)
    report = ingest(store, path, "parquet")
    assert report.messages_added == 2 and report.quarantined == 0
    rows = {r["message_id"]: r for r in store.read("messages", "u1").to_pylist()}
    assert rows["m0"]["ts"] == datetime(2024, 3, 10, tzinfo=UTC) and rows["m0"]["utc_offset_min"] is None
    assert rows["m1"]["ts"] == datetime(2024, 3, 11, tzinfo=UTC)
    assert parse_stamp(date(2024, 3, 10)) == parse_stamp("2024-03-10") == (datetime(2024, 3, 10, tzinfo=UTC), None)
