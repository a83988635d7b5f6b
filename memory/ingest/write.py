"""Writing: one parsed batch checked against what the store holds for its users, then upserted.

Stored messages are read per user (tenant-scoped), only those the batch repeats or whose sessions it
extends: a stored id with other text is quarantined, new messages continue their session's `seq`, and
only session rows that change are written. Observations and quarantine rows already stored are skipped.
Every table is written with one upsert (new messages: plain inserts of :data:`INSERT_ROWS` rows), and the
run is recorded in `runs`.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

import polars as pl
from lancedb.expr import col

from memory.ids import make_id, new_run_id, progress_id
from memory.ingest.common import (OBSERVATIONS_SCHEMA, REUSED_ID, SESSIONS_SCHEMA, TS, ArchiveBatch,
                                  FrameSchema, RawOf, quarantine_row)
from memory.ingest.validate import read_archive, sessions_frame, with_raw
from memory.store import Store

__all__ = ["INSERT_ROWS", "READ_KEYS", "IngestReport", "ingest", "ingest_batch", "StoredBatch", "store_batch",
           "count_reasons", "consolidated_sessions", "quarantine_id"]

log = logging.getLogger(__name__)

#: new messages inserted this many at a time (`Store.conform` makes each row's terms and null vector:
#: a whole archive at once took several times its size)
INSERT_ROWS = 10_000
#: ids (and session ids) one read of the stored messages a batch touches names at most
READ_KEYS = 5_000


@dataclass
class IngestReport:
    """What one `ingest` call read, added and set aside."""

    archive: str
    format: str
    users: list[str]
    sessions: int
    messages_read: int
    messages_added: int
    observations: int
    quarantined: int
    reasons: dict[str, int]
    seconds: float
    run_id: str = ""

    def summary(self) -> str:
        ranked = sorted(self.reasons.items(), key=lambda kv: -kv[1])
        why = "; ".join(f"{r}: {n}" for r, n in ranked[:5]) + (
            f"; +{len(ranked) - 5} more reasons ({sum(n for _, n in ranked[5:])} rows)" if len(ranked) > 5 else "")
        return (f"ingest {self.archive} ({self.format}): {len(self.users)} users, {self.sessions} sessions, "
                f"{self.messages_read} messages read, {self.messages_added} added, "
                f"{self.observations} observations, {self.quarantined} quarantined"
                + (f" ({why})" if why else "") + f"; {self.seconds:.1f}s")


def ingest(store: Store, path: str | Path, fmt: str, *, observations_as_fragments: bool = False,
           run_id: str | None = None, user_id: str | None = None) -> IngestReport:
    """Read one archive and upsert its new messages, sessions, observations and quarantined rows.

    `user_id` (format `beam` only, one chat) files the chat under that user instead of the one its
    folders name."""
    start = time.perf_counter()
    batch = read_archive(path, fmt, observations_as_fragments=observations_as_fragments, user_id=user_id)
    return ingest_batch(store, batch, run_id=run_id, start=start)


def ingest_batch(store: Store, batch: ArchiveBatch, *, run_id: str | None = None,
                 start: float | None = None) -> IngestReport:
    """Upsert one archive already read (`read_archive`) and record the run; `start` (a
    `time.perf_counter()` reading) is when its reading began, for the report's seconds. Read first,
    then open the store: an archive that cannot be read makes no store."""
    start = time.perf_counter() if start is None else start
    started_at = datetime.now(timezone.utc)
    run_id = run_id or new_run_id("ingest")
    users = sorted(batch.messages["user_id"].unique().to_list())

    done = store_batch(store, batch, run_id)
    new, quarantine, written = done.new, done.quarantine, done.written
    log.info("%s: wrote %s", batch.archive, ", ".join(f"{n} {k}" for k, n in written.items()))
    reasons = count_reasons(quarantine)
    report = IngestReport(
        archive=batch.archive, format=batch.format, users=users, sessions=batch.sessions.height,
        messages_read=batch.messages_read, messages_added=new.height, observations=batch.observations.height,
        quarantined=len(quarantine), reasons=reasons, seconds=time.perf_counter() - start, run_id=run_id)
    counts = {"messages_read": report.messages_read, "messages_added": report.messages_added,
              "sessions": report.sessions, "observations": report.observations,
              "quarantined": report.quarantined, "reasons": reasons, "written": written,
              "archive": batch.archive, "format": batch.format}
    store.upsert("runs", [{
        "id": run_id, "kind": "ingest", "status": "completed", "started_at": started_at,
        "finished_at": datetime.now(timezone.utc), "users": users,
        "counts_json": json.dumps(counts, sort_keys=True), "llm_calls": 0, "tokens_in": 0, "tokens_out": 0,
        "cache_hits": 0, "quarantined": report.quarantined, "seconds": report.seconds,
    }])
    if quarantine:
        log.warning("%s: %d rows quarantined (%s)", batch.archive, len(quarantine),
                    ", ".join(f"{r}: {n}" for r, n in sorted(reasons.items())))
    log.info(report.summary())
    return report


@dataclass
class StoredBatch:
    """What `store_batch` did: the messages it added (with `seq`), every row it set aside (the batch's
    own and the reused ids it found in the store) and the rows written per table."""

    new: pl.DataFrame
    quarantine: list[dict[str, Any]]
    written: dict[str, int]


def store_batch(store: Store, batch: ArchiveBatch, run_id: str) -> StoredBatch:
    """Check a validated batch against what the store holds (reused ids, `seq` of known sessions)
    and upsert its new messages, changed sessions, observations and quarantine rows, all under one
    hold of the store's writer lease (so two writers never add the same message twice)."""
    with store.write_lease():
        quarantine = list(batch.quarantine)
        existing = _existing_messages(store, batch)
        reused, new = _against_stored(batch.messages, existing, batch.raw_of)
        quarantine += reused
        sessions = _changed_sessions(store, batch, new, existing)
        observations = _new_observations(store, batch.observations)
        q_rows = _new_quarantine(store, quarantine, run_id)
        written = {
            # checked above, under the lease: none of these ids is stored
            "messages": _insert_messages(store, new),
            "sessions": store.upsert("sessions", sessions.to_arrow()) if sessions.height else 0,
            "observations": store.upsert("observations", observations.to_arrow()) if observations.height else 0,
            "quarantine": store.upsert("quarantine", q_rows) if q_rows else 0,
        }
    return StoredBatch(new=new, quarantine=quarantine, written=written)


def _insert_messages(store: Store, new: pl.DataFrame) -> int:
    """Insert the new messages :data:`INSERT_ROWS` at a time, in the batch's order (each session's in
    `seq` order: a write cut short leaves each session's first ones, and ingesting again adds the rest
    with the same `seq`). When the table had no user index, the one its first insert made is built
    again over every row, as one insert would have made it. Returns the rows written."""
    if new.height <= INSERT_ROWS:
        return store.insert("messages", new.drop("source", "raw").to_arrow()) if new.height else 0
    tbl = store.table("messages")
    tbl.checkout_latest()
    indexed = any("user_id" in idx.columns for idx in tbl.list_indices())
    written = sum(store.insert("messages", part.drop("source", "raw").to_arrow())
                  for part in new.iter_slices(INSERT_ROWS))
    if not indexed:
        store.reindex_users("messages")
    return written


def count_reasons(quarantine: list[dict[str, Any]]) -> dict[str, int]:
    """Quarantined rows per reason."""
    reasons: dict[str, int] = {}
    for q in quarantine:
        reasons[q["reason"]] = reasons.get(q["reason"], 0) + 1
    return reasons


#: the stored messages' columns a batch is checked against
STORED: FrameSchema = {"user_id": pl.String, "message_id": pl.String, "text": pl.String, "session_id": pl.String,
                       "seq": pl.Int32, "speaker": pl.String, "ts": TS}


def _existing_messages(store: Store, batch: ArchiveBatch) -> pl.DataFrame:
    """The stored messages this batch touches, read one user at a time (tenant-scoped): those whose
    ids it repeats, with their text (to spot a reused id), and those of its sessions, without it (to
    continue `seq` and recompute the session rows: an append to a long session reads no text of it).
    The rest of a user's history is not read."""
    cols = ["message_id", "session_id", "seq", "speaker", "ts"]
    schema = STORED
    frames = [pl.DataFrame(schema=schema)]
    if store.has_table("messages"):
        for (user,), mine in batch.messages.group_by("user_id"):
            repeated = _stored_of(store, str(user), [*cols, "text"], "id", mine["id"].to_list())
            mates = _stored_of(store, str(user), cols, "session_id", mine["session_id"].unique().to_list())
            df = pl.concat([repeated, mates.with_columns(text=pl.lit(None, pl.String))], how="diagonal")
            if df.height:   # a repeated id of one of its sessions: the row with its text
                frames.append(df.unique("message_id", keep="first", maintain_order=True)
                              .with_columns(user_id=pl.lit(user)).select(list(schema)).cast(pl.Schema(schema)))
    return pl.concat(frames)


def _stored_of(store: Store, user: str, cols: list[str], key: str, values: list[str]) -> pl.DataFrame:
    """The user's stored messages whose `key` column is one of `values`, read :data:`READ_KEYS` values
    at a time (a filter naming a whole archive's ids took several times the rows' size to run)."""
    parts = []
    for i in range(0, len(values), READ_KEYS):
        df = pl.from_arrow(store.read("messages", user, columns=cols, where=col(key).isin(values[i:i + READ_KEYS])))
        assert isinstance(df, pl.DataFrame)
        parts.append(df.cast(pl.Schema({c: STORED[c] for c in cols})))
    return pl.concat(parts) if parts else pl.DataFrame(schema={c: STORED[c] for c in cols})


def _against_stored(messages: pl.DataFrame, existing: pl.DataFrame,
                    raw_of: RawOf | None) -> tuple[list[dict[str, Any]], pl.DataFrame]:
    """(quarantine rows of the messages whose ids are stored with other text, their raw text read
    again by `raw_of` where the batch left it out; the messages not stored, their `seq` continued)."""
    stored = existing.select("user_id", "message_id", _old=pl.col("text"), _stored=pl.lit(True))
    joined = messages.join(stored, on=["user_id", "message_id"], how="left", maintain_order="left")
    conflicts = joined.filter(pl.col("_stored").fill_null(False) & pl.col("text").ne_missing(pl.col("_old")))
    reused = [quarantine_row(r["user_id"], r["source"], REUSED_ID, r["raw"])
              for r in with_raw(conflicts, raw_of).iter_rows(named=True)]
    return reused, _continue_seq(joined.filter(pl.col("_stored").is_null()).drop("_old", "_stored"), existing)


def _continue_seq(new: pl.DataFrame, existing: pl.DataFrame) -> pl.DataFrame:
    """New messages of a session the store already has go after its stored ones, in their own order."""
    offset = existing.group_by("user_id", "session_id").agg(_off=pl.col("seq").max() + 1)
    return (new.join(offset, on=["user_id", "session_id"], how="left", maintain_order="left")
            .with_columns(seq=(pl.col("seq").rank("ordinal").over("user_id", "session_id") - 1
                               + pl.col("_off").fill_null(0)).cast(pl.Int32))
            .drop("_off"))


def _changed_sessions(store: Store, batch: ArchiveBatch, new: pl.DataFrame,
                      existing: pl.DataFrame) -> pl.DataFrame:
    """Session rows of the batch recomputed over stored + new messages; only those that differ."""
    keys = batch.sessions.select("user_id", "session_id")
    cols = ["user_id", "session_id", "seq", "speaker", "ts"]
    union = pl.concat([existing.join(keys, on=["user_id", "session_id"], how="semi").select(cols),
                       new.select(cols)])
    fresh = sessions_frame(union, pl.DataFrame(schema=OBSERVATIONS_SCHEMA), batch.archive)
    observed = {(r["user_id"], r["session_id"]) for r in batch.sessions.filter("observed").iter_rows(named=True)}
    # session ids hash (user, session): reading them by id stays within the batch's users
    stored = {row["id"]: row for row in
              store.read_ids("sessions", fresh["id"].to_list(), columns=list(SESSIONS_SCHEMA)).to_pylist()}
    moving = [(r["user_id"], r["session_id"]) for r in fresh.iter_rows(named=True)
              if r["id"] in stored and r["ts"] != stored[r["id"]]["ts"]]
    settled = consolidated_sessions(store, moving)
    changed = []
    for row in fresh.iter_rows(named=True):
        old = stored.get(row["id"])
        row["observed"] = (row["user_id"], row["session_id"]) in observed or bool(old and old["observed"])
        if old:
            row["archive"] = old["archive"]
        row["ts"] = settled.get((row["user_id"], row["session_id"]), row["ts"])
        if old != row:
            changed.append(row)
    return pl.DataFrame(changed, schema=SESSIONS_SCHEMA)


def consolidated_sessions(store: Store, sessions: Iterable[tuple[str, str]]) -> dict[tuple[str, str], datetime]:
    """Those of the (user, session) pairs a consolidation has taken in (they have a `progress` row),
    each with the time it was consolidated with (the row's `session_ts`).

    Such a session keeps its time when a later turn is dated before its first one (an append, a
    re-ingest, doctor's repair): its fragments, clusters and graph place carry that time, and a
    session must have one time in all of them. The new turn keeps its own time."""
    pairs = list(sessions)
    if not pairs or not store.has_table("progress"):
        return {}
    ids = {progress_id(u, s): (u, s) for u, s in pairs}
    rows = store.read_ids("progress", sorted(ids), columns=["id", "user_id", "session_ts"]).to_pylist()
    # ids hash (user, session): a row read is the pair asked for; the user check keeps it scoped
    return {ids[r["id"]]: r["session_ts"] for r in rows
            if r["id"] in ids and r["user_id"] == ids[r["id"]][0] and r["session_ts"] is not None}


def _new_observations(store: Store, observations: pl.DataFrame) -> pl.DataFrame:
    if observations.height == 0 or not store.has_table("observations"):
        return observations
    have = store.read_ids("observations", observations["id"].to_list(), columns=["id"]).column("id").to_pylist()
    return observations.filter(~pl.col("id").is_in(have))


def quarantine_id(row: dict[str, Any]) -> str:
    """The deterministic id of an ingest quarantine row: its user (when it has one), source, reason and
    raw text, so the same bad record ingested for two users is two rows, each its user's."""
    parts = (row["source"], row["reason"], row["raw"])
    return make_id(*parts) if row["user_id"] is None else make_id(row["user_id"], *parts)


def _new_quarantine(store: Store, rows: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    """Quarantine rows with their deterministic ids, minus those already set aside by an earlier run
    (also one stored, for the same user, under the id of an older version, which named no user)."""
    now = datetime.now(timezone.utc)
    by_id = {quarantine_id(r): r for r in rows}
    if not by_id:
        return []
    older = {qid: make_id(r["source"], r["reason"], r["raw"]) for qid, r in by_id.items() if r["user_id"] is not None}
    have = {q["id"]: q["user_id"] for q in store.read_ids(
        "quarantine", sorted(set(by_id) | set(older.values())), columns=["id", "user_id"]).to_pylist()}
    return [{**r, "id": qid, "run_id": run_id, "created_at": now} for qid, r in by_id.items()
            if qid not in have and not (qid in older and have.get(older[qid], "") == r["user_id"])]
