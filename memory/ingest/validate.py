"""Batch validation: one archive's rows checked as a batch and shaped into frames (no store).

A row is set aside (with its reason) when its reader rejected it, its user id is invalid, a field is
over its length limit or holds a NUL or a lone surrogate (:func:`memory.ingest.common.row_problem`), or
it reuses a message id of the same file with other text; an observation when it cites no message of its
session. What is kept becomes the `messages`, `sessions` and `observations` frames of an ArchiveBatch.

An archive's kept rows are framed :data:`CHUNK_ROWS` at a time (`validate_frame`) and its reused ids
found on the whole frame, so a large archive is never held as Python dicts (they took several times
the file's size); an append's few turns go through `validate_rows`, with the same checks.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterable, Iterator

import polars as pl

from memory.errors import IngestError
from memory.ids import make_id, validate_user_id
from memory.ingest.common import (FOLDER_FORMATS, FORMATS, MESSAGES_SCHEMA, OBSERVATIONS_SCHEMA, REUSED_ID,
                                  SESSIONS_SCHEMA, ArchiveBatch, RawOf, quarantine_row, row_problem, valid_user)
from memory.ingest.readers import locomo_observations, raw_reader, read_json, read_rows

__all__ = ["CHUNK_ROWS", "checked_path", "read_archive", "validate_rows", "validate_frame", "with_raw",
           "messages_frame", "sessions_frame"]

log = logging.getLogger(__name__)

#: kept rows of an archive turned into a frame at a time (`validate_frame`)
CHUNK_ROWS = 25_000
#: the columns of kept records, as readers yield them (`id`, `seq` and `archive` come later)
_RECORD_SCHEMA = {k: v for k, v in MESSAGES_SCHEMA.items() if k not in ("id", "seq", "archive")}
_KEY = ["user_id", "message_id"]


def checked_path(path: str | Path, fmt: str, user_id: str | None, *,
                 observations_as_fragments: bool = False) -> Path:
    """The archive's path once its format, the user id, the observations flag (LoCoMo's alone) and
    the path itself are checked (an `IngestError` naming what is wrong), before any row is read."""
    path = Path(path)
    if fmt not in FORMATS:
        raise IngestError(f"unknown archive format {fmt!r} (known: {', '.join(FORMATS)})", format=fmt,
                          known=list(FORMATS))
    if observations_as_fragments and fmt != "locomo":
        raise IngestError(f"only format locomo records observations to import as fragments, not {fmt}", format=fmt)
    if user_id is not None:
        if fmt != "beam":
            raise IngestError(f"a user id can be given for format beam only, not {fmt}", format=fmt)
        validate_user_id(user_id)
    if path.is_dir() and fmt not in FOLDER_FORMATS:
        raise IngestError(f"{path} is a directory: format {fmt} reads one file", archive=str(path), format=fmt)
    if not path.exists():
        raise IngestError(f"archive not found: {path}", archive=str(path))
    if not (path.is_file() or path.is_dir()):
        raise IngestError(f"{path} is not a regular file", archive=str(path))
    return path


def read_archive(path: str | Path, fmt: str, *, observations_as_fragments: bool = False,
                 user_id: str | None = None) -> ArchiveBatch:
    """Parse one archive into message, session and observation frames plus quarantined rows (no store).

    `user_id` (format `beam` only, one chat) files the chat under that user instead of the one its
    folders name."""
    path = checked_path(path, fmt, user_id, observations_as_fragments=observations_as_fragments)
    try:
        data = read_json(path) if fmt in ("locomo", "longmemeval") else None
        raw_of = raw_reader(path, fmt)
        kept, quarantine, read = validate_frame(read_rows(path, fmt, data, user_id), CHUNK_ROWS, raw_of=raw_of)
    except OSError as exc:   # permissions, a file gone while read: nothing of the archive is stored
        raise IngestError(f"cannot read {exc.filename or path}: {exc.strerror or exc}", archive=str(path)) from None
    messages = messages_frame(kept, path.name)
    observations = pl.DataFrame(schema=OBSERVATIONS_SCHEMA)
    if observations_as_fragments:
        observations, bad = _observations_frame(locomo_observations(path, data), messages, path.name)
        quarantine.extend(bad)
    sessions = sessions_frame(messages, observations, path.name)
    log.info("read %s (%s): %d messages read, %d kept, %d sessions, %d observations, %d quarantined",
             path.name, fmt, read, messages.height, sessions.height, observations.height, len(quarantine))
    return ArchiveBatch(archive=path.name, format=fmt, messages=messages, sessions=sessions,
                        observations=observations, quarantine=quarantine, messages_read=read, raw_of=raw_of)


def validate_rows(rows: Iterable[tuple[str, dict[str, Any]]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """(kept message records, quarantine rows, rows read) of a reader's output: the checks every
    ingest and every append share (see the module doc)."""
    records, quarantine = [], []
    seen: dict[tuple[str, str], str] = {}
    read = 0
    for kind, row in rows:
        read += 1
        if (bad := _screened(kind, row)) is not None:
            quarantine.append(bad)
        elif (key := (row["user_id"], row["message_id"])) in seen:
            if seen[key] != row["text"]:
                quarantine.append(quarantine_row(row["user_id"], row["source"], REUSED_ID, row["raw"]))
        else:
            seen[key] = row["text"]
            records.append(row)
    return records, quarantine, read


def validate_frame(rows: Iterable[tuple[str, dict[str, Any]]], chunk_rows: int = CHUNK_ROWS, *,
                   raw_of: RawOf | None = None) -> tuple[pl.DataFrame, list[dict[str, Any]], int]:
    """`validate_rows` for an archive: the kept records as one frame in file order (with their `id`;
    `messages_frame` takes it), framed `chunk_rows` at a time. A message id repeated in the file is
    checked on the whole frame: its first row is kept, a later one with other text quarantined and one
    with the same text dropped, as `validate_rows` does; quarantine rows stay in file order. With
    `raw_of` (`readers.raw_reader`) a kept record's `raw` is left out (null), and read again for a
    repeated id quarantined."""
    frames, chunk, order = [], [], []
    quarantine: list[tuple[int, dict[str, Any]]] = []
    read = 0
    for kind, row in rows:
        if (bad := _screened(kind, row)) is not None:
            quarantine.append((read, bad))
        else:
            chunk.append(row if raw_of is None else {**row, "raw": None})
            order.append(read)
            if len(chunk) >= chunk_rows:
                frames.append(_records_frame(chunk).with_columns(_read=pl.Series(order, dtype=pl.Int64)))
                chunk, order = [], []
        read += 1
    frames.append(_records_frame(chunk).with_columns(_read=pl.Series(order, dtype=pl.Int64)))
    df = pl.concat(frames)
    # the rows whose ids hash alike hold every repeated id (in file order): checked exactly among them
    alike = df.filter(pl.struct(_KEY).hash().is_duplicated()).with_columns(_nth=pl.int_range(pl.len()).over(_KEY))
    repeated = alike.filter(pl.col("_nth") > 0)
    if repeated.height:
        first = alike.filter(pl.col("_nth") == 0).select(*_KEY, _first=pl.col("text"))
        reused = repeated.join(first, on=_KEY, how="left").filter(pl.col("text").ne_missing(pl.col("_first")))
        quarantine += [(r["_read"], quarantine_row(r["user_id"], r["source"], REUSED_ID, r["raw"]))
                       for r in with_raw(reused, raw_of).iter_rows(named=True)]
        quarantine.sort(key=lambda q: q[0])
        df = df.filter(~pl.col("_read").is_in(repeated["_read"].implode()))
    return df.drop("_read"), [q for _, q in quarantine], read


def with_raw(rows: pl.DataFrame, raw_of: RawOf | None) -> pl.DataFrame:
    """`rows` (of a messages frame) with the `raw` of each filled in by `raw_of` where it was left out."""
    missing = rows.filter(pl.col("raw").is_null())
    if not missing.height or raw_of is None:
        return rows
    found = raw_of(missing.select("source", "user_id", "message_id", "text").iter_rows(named=True))
    return rows.with_columns(raw=pl.coalesce("raw", pl.col("source").replace_strict(found, default=None,
                                                                                    return_dtype=pl.String)))


def _screened(kind: str, row: dict[str, Any]) -> dict[str, Any] | None:
    """The quarantine row of a reader's row that fails a check of its own (the reader's, its user id,
    `row_problem`); None for a message record that passes them."""
    if kind == "bad":
        return row
    if not valid_user(row["user_id"]):
        return quarantine_row(None, row["source"], "invalid user_id", row["raw"])
    if problem := row_problem(row):
        return quarantine_row(row["user_id"], row["source"], problem, row["raw"])
    return None


def _records_frame(records: list[dict[str, Any]]) -> pl.DataFrame:
    """Message records as a frame, with the `id` of each."""
    return pl.DataFrame(records, schema=_RECORD_SCHEMA).with_columns(
        id=pl.Series([make_id(r["user_id"], r["message_id"]) for r in records], dtype=pl.String))


def messages_frame(records: list[dict[str, Any]] | pl.DataFrame, archive: str) -> pl.DataFrame:
    """The `messages` frame of kept records (a list, or `validate_frame`'s frame): ids, `seq` per
    session in time order (file order breaking ties), the archive name."""
    df = _records_frame(records) if isinstance(records, list) else records
    if df.height == 0:
        return pl.DataFrame(schema=MESSAGES_SCHEMA)
    df = df.with_row_index("_order").sort(["user_id", "session_id", "ts", "_order"])
    df = df.with_columns(
        seq=pl.int_range(pl.len()).over("user_id", "session_id").cast(pl.Int32),
        archive=pl.lit(archive),
    )
    return df.select(list(MESSAGES_SCHEMA))


def _observations_frame(items: Iterator[tuple[str, dict[str, Any]]], messages: pl.DataFrame,
                        archive: str) -> tuple[pl.DataFrame, list[dict[str, Any]]]:
    known: dict[tuple[str, str], set[str]] = {}
    for (user, sid), group in messages.group_by("user_id", "session_id"):
        known[(str(user), str(sid))] = set(group["message_id"].to_list())
    rows: dict[str, dict[str, Any]] = {}
    bad = []
    for kind, item in items:
        if kind == "bad":
            bad.append(item)
            continue
        user, sid = item["user_id"], item["session_id"]
        if not valid_user(user):
            bad.append(quarantine_row(None, item["source"], "invalid user_id", item["raw"]))
            continue
        ids = known.get((user, sid), set())
        sources = list(dict.fromkeys(r for r in item["refs"] if r in ids))
        if not sources:
            reason = "observation cites no message of its session" if ids else "observation of an unknown session"
            bad.append(quarantine_row(user, item["source"], reason, item["raw"]))
            continue
        oid = make_id(user, sid, item["content"], *sources)
        rows.setdefault(oid, {"id": oid, "user_id": user, "session_id": sid, "subject": item["subject"],
                              "content": item["content"], "source_ids": sources, "archive": archive})
    return pl.DataFrame(list(rows.values()), schema=OBSERVATIONS_SCHEMA), bad


def sessions_frame(messages: pl.DataFrame, observations: pl.DataFrame, archive: str) -> pl.DataFrame:
    """One row per (user, session) of `messages`: first timestamp, message count, speakers, observed."""
    if messages.height == 0:
        return pl.DataFrame(schema=SESSIONS_SCHEMA)
    observed = observations.select("user_id", "session_id").unique().with_columns(observed=pl.lit(True))
    df = (messages.sort("user_id", "session_id", "seq")
          .group_by("user_id", "session_id", maintain_order=True)
          .agg(ts=pl.col("ts").min(), n_messages=pl.len().cast(pl.Int32),
               speakers=pl.col("speaker").unique(maintain_order=True))
          .join(observed, on=["user_id", "session_id"], how="left")
          .with_columns(observed=pl.col("observed").fill_null(False), archive=pl.lit(archive),
                        id=pl.struct("user_id", "session_id").map_elements(
                            lambda r: make_id(r["user_id"], r["session_id"]), return_dtype=pl.String)))
    return df.select(list(SESSIONS_SCHEMA))
