"""What the ingest modules share: the formats, the frame schemas, the parsed batch and quarantine rows."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from memory.errors import InvalidUserIdError
from memory.ids import validate_user_id

__all__ = ["FORMATS", "STAGE", "REUSED_ID", "FIELDS", "TS", "MESSAGES_SCHEMA", "SESSIONS_SCHEMA",
           "OBSERVATIONS_SCHEMA", "FrameSchema", "ArchiveBatch", "quarantine_row", "valid_user", "dump_raw"]

FORMATS = ("locomo", "longmemeval", "jsonl", "parquet")
STAGE = "ingest"
REUSED_ID = "reused message id with other text"
#: fields of one jsonl line / parquet row; `speaker` may be given as `role`
FIELDS = ("user_id", "session_id", "message_id", "speaker", "text", "timestamp")

TS = pl.Datetime("us", "UTC")
#: a frame schema: column name -> Polars dtype (a dtype class such as pl.String, or an instance)
FrameSchema = dict[str, "pl.DataType | type[pl.DataType]"]
MESSAGES_SCHEMA: FrameSchema = {"id": pl.String, "user_id": pl.String, "session_id": pl.String, "message_id": pl.String,
             "seq": pl.Int32, "speaker": pl.String, "text": pl.String, "ts": TS, "archive": pl.String,
             "source": pl.String, "raw": pl.String}
SESSIONS_SCHEMA: FrameSchema = {"id": pl.String, "user_id": pl.String, "session_id": pl.String, "ts": TS,
             "n_messages": pl.Int32, "speakers": pl.List(pl.String), "archive": pl.String,
             "observed": pl.Boolean}
OBSERVATIONS_SCHEMA: FrameSchema = {"id": pl.String, "user_id": pl.String, "session_id": pl.String, "subject": pl.String,
                 "content": pl.String, "source_ids": pl.List(pl.String), "archive": pl.String}


@dataclass
class ArchiveBatch:
    """One archive parsed: `messages` also carries `source` and `raw` (dropped when written)."""

    archive: str
    format: str
    messages: pl.DataFrame
    sessions: pl.DataFrame
    observations: pl.DataFrame
    quarantine: list[dict[str, Any]] = field(default_factory=list)
    messages_read: int = 0


def quarantine_row(user_id: Any, source: str, reason: str, raw: str) -> dict[str, Any]:
    """An ingest `quarantine` row (no id yet); `user_id` is kept only when it is a valid user id."""
    return {"user_id": user_id if isinstance(user_id, str) and valid_user(user_id) else None,
            "stage": STAGE, "source": source, "reason": reason, "raw": raw}


def valid_user(user_id: Any) -> bool:
    """Does `user_id` pass the strict user id pattern?"""
    try:
        validate_user_id(user_id)
        return True
    except InvalidUserIdError:
        return False


def dump_raw(obj: Any) -> str:
    """JSON text of a raw row that is always valid UTF-8 (lone surrogates escaped)."""
    text = json.dumps(obj, ensure_ascii=False, default=str)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return json.dumps(obj, ensure_ascii=True, default=str)
