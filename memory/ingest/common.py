"""What the ingest modules share: the formats, the frame schemas, the parsed batch and quarantine rows."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from typing import Any, Callable, Iterable, Iterator

import polars as pl

from memory.errors import InvalidUserIdError
from memory.ids import validate_user_id

__all__ = ["FORMATS", "FOLDER_FORMATS", "STAGE", "REUSED_ID", "FIELDS", "MAX_TEXT_CHARS", "MAX_ID_CHARS", "TS",
           "MESSAGES_SCHEMA", "SESSIONS_SCHEMA", "OBSERVATIONS_SCHEMA", "FrameSchema", "ArchiveBatch", "Reader",
           "RawOf", "quarantine_row", "valid_user", "dump_raw", "has_surrogate", "row_problem", "parse_time",
           "bad_time", "record", "parse_stamp"]

FORMATS = ("locomo", "longmemeval", "jsonl", "parquet", "beam")
#: formats whose PATH may also be a folder (the others read one file)
FOLDER_FORMATS = ("beam",)
STAGE = "ingest"
REUSED_ID = "reused message id with other text"
#: fields of one jsonl line / parquet row; `speaker` may be given as `role`
FIELDS = ("user_id", "session_id", "message_id", "speaker", "text", "timestamp")
#: longest message text kept (characters); longer messages are quarantined. Generous on purpose: the
#: longest BEAM development message is about 350,000 characters.
MAX_TEXT_CHARS = 1_000_000
#: longest session id, message id and speaker kept (characters)
MAX_ID_CHARS = 256

TS = pl.Datetime("us", "UTC")
#: a frame schema: column name -> Polars dtype (a dtype class such as pl.String, or an instance)
FrameSchema = dict[str, "pl.DataType | type[pl.DataType]"]
MESSAGES_SCHEMA: FrameSchema = {"id": pl.String, "user_id": pl.String, "session_id": pl.String, "message_id": pl.String,
             "seq": pl.Int32, "speaker": pl.String, "text": pl.String, "ts": TS, "utc_offset_min": pl.Int32,
             "archive": pl.String, "source": pl.String, "raw": pl.String}
SESSIONS_SCHEMA: FrameSchema = {"id": pl.String, "user_id": pl.String, "session_id": pl.String, "ts": TS,
             "n_messages": pl.Int32, "speakers": pl.List(pl.String), "archive": pl.String,
             "observed": pl.Boolean}
OBSERVATIONS_SCHEMA: FrameSchema = {"id": pl.String, "user_id": pl.String, "session_id": pl.String, "subject": pl.String,
                 "content": pl.String, "source_ids": pl.List(pl.String), "archive": pl.String}


Reader = Iterator[tuple[str, dict[str, Any]]]  # ("msg" | "bad", row)
#: the raw text of kept rows (`source`, `user_id`, `message_id`, `text` each) by source, read again from
#: the archive (`ArchiveBatch.raw_of`)
RawOf = Callable[[Iterable[dict[str, Any]]], dict[str, str]]


@dataclass
class ArchiveBatch:
    """One archive parsed: `messages` also carries `source` and `raw` (dropped when written). With
    `raw_of` (jsonl, parquet) a kept message's `raw` is null, and `raw_of` reads it again from the
    archive when the message is set aside after all (its id stored with other text)."""

    archive: str
    format: str
    messages: pl.DataFrame
    sessions: pl.DataFrame
    observations: pl.DataFrame
    quarantine: list[dict[str, Any]] = field(default_factory=list)
    messages_read: int = 0
    raw_of: RawOf | None = None


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


def has_surrogate(text: str) -> bool:
    """Does `text` hold a lone surrogate (not encodable as UTF-8)?"""
    try:
        text.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def row_problem(row: dict[str, Any]) -> str | None:
    """Why a message record (any format) cannot be kept: a field over its length limit
    (:data:`MAX_TEXT_CHARS`, :data:`MAX_ID_CHARS`), a NUL character or a lone surrogate; None if fine."""
    limits = (("session_id", MAX_ID_CHARS), ("message_id", MAX_ID_CHARS), ("speaker", MAX_ID_CHARS),
              ("text", MAX_TEXT_CHARS))
    for name, limit in limits:
        value = row[name]
        if len(value) > limit:
            return f"{name} longer than {limit} characters"
        if "\x00" in value:
            return f"NUL character in {name}"
        if has_surrogate(value):
            return f"lone surrogate in {name}"
    return None


def _utc(dt: datetime) -> datetime:
    """`dt` in UTC; a naive time is taken as UTC. Raises OverflowError past year 1 or 9999."""
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


def parse_time(value: Any, fmt: str | None = None) -> datetime | None:
    """ISO 8601 (or `fmt`, then dateparser as a fallback for a whole date written otherwise) to an aware
    UTC datetime; None if unparsable."""
    if isinstance(value, datetime):
        try:
            return _utc(value)
        except OverflowError:
            return None
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    try:
        return _utc(datetime.strptime(text, fmt) if fmt else datetime.fromisoformat(text))
    except (ValueError, OverflowError):   # OverflowError: year 1 or 9999 shifted out of range by its offset
        pass
    if fmt is None:
        return None  # generic archives promise ISO 8601: do not guess
    import dateparser

    try:
        # a whole date only: a relative or partial one ("yesterday", "May 20", "20") would be read from
        # today's clock, so the stored time would depend on the day of the ingest
        parsed = dateparser.parse(text, settings={"TIMEZONE": "UTC", "RETURN_AS_TIMEZONE_AWARE": True,
                                                  "PARSERS": ["absolute-time"],
                                                  "REQUIRE_PARTS": ["day", "month", "year"]})
        return _utc(parsed) if parsed else None
    except (OverflowError, ValueError):   # its own time zone shift can leave years 1-9999 too
        return None


def parse_stamp(value: Any) -> tuple[datetime, int | None] | None:
    """An ISO 8601 timestamp (or a datetime, or a date: midnight UTC, as its ISO string) parsed once:
    (aware UTC datetime, the UTC offset in minutes it gave, None when it gave none), kept so dates are
    read in the speaker's time; None if unparsable (as `parse_time`)."""
    if isinstance(value, date) and not isinstance(value, datetime):   # a Parquet date32 / date64
        value = datetime(value.year, value.month, value.day)
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    utc = parse_time(value)
    offset = value.utcoffset()
    return None if utc is None else (utc, None if offset is None else int(offset.total_seconds() // 60))


def bad_time(value: Any) -> str:
    """The quarantine reason for a timestamp that does not parse."""
    return f"unparsable timestamp: {str(value)[:60]!r}"


def record(user_id: Any, session_id: str, message_id: str, speaker: str, text: str, ts: datetime,
           source: str, raw: str, offset: int | None = None) -> dict[str, Any]:
    """One message record as every reader yields it (`offset`: `utc_offset_min` of its timestamp)."""
    return {"user_id": user_id, "session_id": session_id, "message_id": message_id, "speaker": speaker,
            "text": text, "ts": ts, "utc_offset_min": offset, "source": source, "raw": raw}
