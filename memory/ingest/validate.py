"""Batch validation: one archive's rows checked as a batch and shaped into frames (no store).

A row is set aside (with its reason) when its reader rejected it, its user id is invalid, a field is
over its length limit or holds a NUL or a lone surrogate (:func:`memory.ingest.common.row_problem`), or
it reuses a message id of the same file with other text; an observation when it cites no message of its
session. What is kept becomes the `messages`, `sessions` and `observations` frames of an ArchiveBatch.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterable, Iterator

import polars as pl

from memory.errors import IngestError
from memory.ids import make_id, validate_user_id
from memory.ingest.common import (FOLDER_FORMATS, FORMATS, MESSAGES_SCHEMA, OBSERVATIONS_SCHEMA, REUSED_ID,
                                  SESSIONS_SCHEMA, ArchiveBatch, quarantine_row, row_problem, valid_user)
from memory.ingest.readers import locomo_observations, read_json, read_rows

__all__ = ["checked_path", "read_archive", "validate_rows", "messages_frame", "sessions_frame"]

log = logging.getLogger(__name__)


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
        records, quarantine, read = validate_rows(read_rows(path, fmt, data, user_id))
    except OSError as exc:   # permissions, a file gone while read: nothing of the archive is stored
        raise IngestError(f"cannot read {exc.filename or path}: {exc.strerror or exc}", archive=str(path)) from None
    messages = messages_frame(records, path.name)
    observations = pl.DataFrame(schema=OBSERVATIONS_SCHEMA)
    if observations_as_fragments:
        observations, bad = _observations_frame(locomo_observations(path, data), messages, path.name)
        quarantine.extend(bad)
    sessions = sessions_frame(messages, observations, path.name)
    log.info("read %s (%s): %d messages read, %d kept, %d sessions, %d observations, %d quarantined",
             path.name, fmt, read, messages.height, sessions.height, observations.height, len(quarantine))
    return ArchiveBatch(archive=path.name, format=fmt, messages=messages, sessions=sessions,
                        observations=observations, quarantine=quarantine, messages_read=read)


def validate_rows(rows: Iterable[tuple[str, dict[str, Any]]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """(kept message records, quarantine rows, rows read) of a reader's output: the checks every
    ingest and every append share (see the module doc)."""
    records, quarantine = [], []
    seen: dict[tuple[str, str], str] = {}
    read = 0
    for kind, row in rows:
        read += 1
        if kind == "bad":
            quarantine.append(row)
        elif not valid_user(row["user_id"]):
            quarantine.append(quarantine_row(None, row["source"], "invalid user_id", row["raw"]))
        elif problem := row_problem(row):
            quarantine.append(quarantine_row(row["user_id"], row["source"], problem, row["raw"]))
        elif (key := (row["user_id"], row["message_id"])) in seen:
            if seen[key] != row["text"]:
                quarantine.append(quarantine_row(row["user_id"], row["source"], REUSED_ID, row["raw"]))
        else:
            seen[key] = row["text"]
            records.append(row)
    return records, quarantine, read


def messages_frame(records: list[dict[str, Any]], archive: str) -> pl.DataFrame:
    """The `messages` frame of kept records: ids, `seq` per session in time order, the archive name."""
    if not records:
        return pl.DataFrame(schema=MESSAGES_SCHEMA)
    df = pl.DataFrame(records, schema={k: v for k, v in MESSAGES_SCHEMA.items()
                                       if k not in ("id", "seq", "archive")})
    df = df.with_row_index("_order").sort(["user_id", "session_id", "ts", "_order"])
    df = df.with_columns(
        id=pl.struct("user_id", "message_id").map_elements(
            lambda r: make_id(r["user_id"], r["message_id"]), return_dtype=pl.String),
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
