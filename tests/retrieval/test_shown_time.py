"""A turn's time as retrieval shows it (`index.shown_time`): in its speaker's zone with the offset
its timestamp gave, the day its relative dates were read in; UTC, without an offset, when the
archive gave none."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest

from memory.embed import Embedder
from memory.ingest.append import append
from memory.store import Store
from retrieval import RetrievalSettings, Retriever
from retrieval.times import shown_time


def test_local_time_with_its_offset_else_utc() -> None:
    at = datetime(2024, 2, 11, 7, 32, tzinfo=timezone.utc)
    ts = pa.array([at, at, at, at, None], pa.timestamp("us", tz="UTC"))
    got = shown_time(ts, pa.array([-480, 330, 0, None, 60], pa.int32())).to_pylist()
    assert got == ["2024-02-10 23:32 -08:00", "2024-02-11 13:02 +05:30", "2024-02-11 07:32 +00:00",
                   "2024-02-11 07:32", None]
    assert shown_time(ts, None).to_pylist()[:1] == ["2024-02-11 07:32"]   # a store without the column
    eastern = pa.array([at], pa.timestamp("ns", tz="America/New_York"))       # another zone: its instant counts
    assert shown_time(eastern, pa.array([-300], pa.int32())).to_pylist() == ["2024-02-11 02:32 -05:00"]


def test_context_shows_the_day_the_speaker_said_it(tmp_path: Path, embedder: Embedder) -> None:
    store = Store(str(tmp_path), dim=embedder.dim)
    turns = [{"session_id": "s1", "message_id": "m1", "speaker": "erin", "timestamp": "2024-02-10T23:32:00-08:00",
              "text": "I ran my first half marathon yesterday in Portland"},
             {"session_id": "s1", "message_id": "m2", "speaker": "erin", "timestamp": "2024-02-11T07:40:00Z",
              "text": "My knees are sore after the half marathon"}]
    assert append(store, "erin", turns).added == 2
    rows = store.read("messages", "erin").to_pylist()
    vecs = embedder.embed([f"{r['speaker']}: {r['text']}" for r in rows])
    store.upsert("messages", [{**r, "vector": v} for r, v in zip(rows, vecs)])   # as consolidation embeds them
    res = Retriever(store, RetrievalSettings(refresh_ms=0), embedder=embedder).retrieve(
        "erin", "When did I run the half marathon?", k=2, strategy="dense")
    dates = {it.source_ids[0]: it.date for it in res.items}
    assert dates == {"m1": "2024-02-10 23:32 -08:00", "m2": "2024-02-11 07:40 +00:00"}
    assert "[2024-02-10 23:32 -08:00] (message) erin: I ran my first half marathon" in res.context()
