"""Ingest: conversation archives (LoCoMo, LongMemEval, generic JSONL / Parquet) into the store.

`read_archive` is pure: it parses one archive into Polars frames of `messages`, `sessions` and
(LoCoMo, on request) `observations`, plus the rows it set aside, each with a reason and its raw text.
`ingest` checks that batch against what the store already holds for each user (scoped reads), then
writes every table with one upsert. Ids are deterministic, so ingesting a file twice adds nothing.

Bad rows never stop an ingest; they go to `quarantine`. Only an archive that cannot be read at all
(missing file, unknown format, not JSON where JSON is required) raises `IngestError`.
"""
from __future__ import annotations

import json
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import polars as pl
import pyarrow.parquet as pq
from lancedb.expr import col

from memory.errors import IngestError, InvalidUserIdError
from memory.ids import make_id, validate_user_id
from memory.store import Store

log = logging.getLogger(__name__)

FORMATS = ("locomo", "longmemeval", "jsonl", "parquet")
STAGE = "ingest"
REUSED_ID = "reused message id with other text"
#: fields of one jsonl line / parquet row; `speaker` may be given as `role`
FIELDS = ("user_id", "session_id", "message_id", "speaker", "text", "timestamp")

_TS = pl.Datetime("us", "UTC")
_MESSAGES = {"id": pl.String, "user_id": pl.String, "session_id": pl.String, "message_id": pl.String,
             "seq": pl.Int32, "speaker": pl.String, "text": pl.String, "ts": _TS, "archive": pl.String,
             "source": pl.String, "raw": pl.String}
_SESSIONS = {"id": pl.String, "user_id": pl.String, "session_id": pl.String, "ts": _TS,
             "n_messages": pl.Int32, "speakers": pl.List(pl.String), "archive": pl.String,
             "observed": pl.Boolean}
_OBSERVATIONS = {"id": pl.String, "user_id": pl.String, "session_id": pl.String, "subject": pl.String,
                 "content": pl.String, "source_ids": pl.List(pl.String), "archive": pl.String}
_LOCOMO_TIME = "%I:%M %p on %d %B, %Y"          # "1:56 pm on 8 May, 2023"
_LONGMEMEVAL_TIME = "%Y/%m/%d (%a) %H:%M"        # "2023/05/20 (Sat) 02:21"


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


@dataclass
class IngestReport:
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
        why = "; ".join(f"{r}: {n}" for r, n in sorted(self.reasons.items(), key=lambda kv: -kv[1])[:5])
        return (f"ingest {self.archive} ({self.format}): {len(self.users)} users, {self.sessions} sessions, "
                f"{self.messages_read} messages read, {self.messages_added} added, "
                f"{self.observations} observations, {self.quarantined} quarantined"
                + (f" ({why})" if why else "") + f"; {self.seconds:.1f}s")


# -- helpers --------------------------------------------------------------------------------------
def _qrow(user_id: Any, source: str, reason: str, raw: str) -> dict[str, Any]:
    return {"user_id": user_id if isinstance(user_id, str) and _valid_user(user_id) else None,
            "stage": STAGE, "source": source, "reason": reason, "raw": raw}


def _valid_user(user_id: Any) -> bool:
    try:
        validate_user_id(user_id)
        return True
    except InvalidUserIdError:
        return False


def _dump(obj: Any) -> str:
    """JSON text of a raw row that is always valid UTF-8 (lone surrogates escaped)."""
    text = json.dumps(obj, ensure_ascii=False, default=str)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return json.dumps(obj, ensure_ascii=True, default=str)


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def _utc(dt: datetime) -> datetime:
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


def _parse_time(value: Any, fmt: str | None = None) -> datetime | None:
    """ISO 8601 (or `fmt`, then dateparser as a fallback) to an aware UTC datetime; None if unparsable."""
    if isinstance(value, datetime):
        return _utc(value)
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    try:
        return _utc(datetime.strptime(text, fmt) if fmt else datetime.fromisoformat(text))
    except ValueError:
        pass
    if fmt is None:
        return None  # generic archives promise ISO 8601: do not guess
    import dateparser

    parsed = dateparser.parse(text, settings={"TIMEZONE": "UTC", "RETURN_AS_TIMEZONE_AWARE": True})
    return _utc(parsed) if parsed else None


def _bad_time(value: Any) -> str:
    return f"unparsable timestamp: {str(value)[:60]!r}"


def _record(user_id: Any, session_id: str, message_id: str, speaker: str, text: str, ts: datetime,
            source: str, raw: str) -> dict[str, Any]:
    return {"user_id": user_id, "session_id": session_id, "message_id": message_id, "speaker": speaker,
            "text": text, "ts": ts, "source": source, "raw": raw}


# -- readers: each yields message records and quarantine rows -------------------------------------
Reader = Iterator[tuple[str, dict[str, Any]]]  # ("msg" | "bad", row)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as exc:
        raise IngestError(f"{path.name} is not a JSON archive: {exc}", archive=str(path)) from exc


def _read_locomo(path: Path, data: Any) -> Reader:
    if not isinstance(data, list):
        raise IngestError(f"{path.name}: a LoCoMo archive is a JSON list of samples", archive=str(path))
    for i, sample in enumerate(data):
        conv = sample.get("conversation") if isinstance(sample, dict) else None
        user = sample.get("sample_id") if isinstance(sample, dict) else None
        if not isinstance(conv, dict):
            yield "bad", _qrow(user, f"{path.name}:sample {i}", "missing field: conversation", _dump(sample))
            continue
        numbers = sorted(int(m.group(1)) for k in conv if (m := re.fullmatch(r"session_(\d+)", k)))
        for n in numbers:
            sid, turns, when = f"session_{n}", conv[f"session_{n}"], conv.get(f"session_{n}_date_time")
            ts = _parse_time(when, _LOCOMO_TIME)
            for j, turn in enumerate(turns if isinstance(turns, list) else []):
                source, raw = f"{path.name}:{user}/{sid}/{j}", _dump(turn)
                if ts is None:
                    yield "bad", _qrow(user, source, _bad_time(when), raw)
                    continue
                if not isinstance(turn, dict):
                    yield "bad", _qrow(user, source, "invalid turn", raw)
                    continue
                missing = next((f for f in ("dia_id", "speaker", "text") if not isinstance(turn.get(f), str)),
                               None)
                if missing:
                    yield "bad", _qrow(user, source, f"missing field: {missing}", raw)
                    continue
                text = turn["text"]
                if isinstance(turn.get("blip_caption"), str) and turn["blip_caption"].strip():
                    text = f"{text} [shares an image: {turn['blip_caption'].strip()}]".strip()
                yield "msg", _record(user, sid, turn["dia_id"], turn["speaker"], text, ts, source, raw)


def _locomo_observations(path: Path, data: list[Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """("obs", {user_id, session_id, subject, content, refs, source, raw}) or ("bad", quarantine row)."""
    for sample in data:
        if not isinstance(sample, dict) or not isinstance(sample.get("observation"), dict):
            continue
        user = sample.get("sample_id")
        for key, by_speaker in sample["observation"].items():
            m = re.fullmatch(r"(session_\d+)_observation", key)
            for speaker, items in (by_speaker.items() if isinstance(by_speaker, dict) else []):
                for k, item in enumerate(items if isinstance(items, list) else []):
                    source, raw = f"{path.name}:{user}/{key}/{speaker}/{k}", _dump(item)
                    ok = (m and isinstance(item, (list, tuple)) and len(item) >= 2
                          and isinstance(item[0], str) and item[0].strip())
                    if not ok:
                        yield "bad", _qrow(user, source, "malformed observation", raw)
                        continue
                    refs = item[1] if isinstance(item[1], list) else re.split(r"[,;\s]+", str(item[1]))
                    yield "obs", {"user_id": user, "session_id": m.group(1), "subject": speaker,
                                  "content": item[0].strip(), "refs": [str(r) for r in refs if str(r)],
                                  "source": source, "raw": raw}


def _read_longmemeval(path: Path, data: Any) -> Reader:
    if not isinstance(data, list):
        raise IngestError(f"{path.name}: a LongMemEval archive is a JSON list of questions", archive=str(path))
    for i, item in enumerate(data):
        user = item.get("question_id") if isinstance(item, dict) else None
        sessions = item.get("haystack_sessions") if isinstance(item, dict) else None
        if not isinstance(sessions, list):
            yield "bad", _qrow(user, f"{path.name}:item {i}", "missing field: haystack_sessions", _dump(item))
            continue
        dates = item.get("haystack_dates") or []
        ids = item.get("haystack_session_ids") or []
        for s, turns in enumerate(sessions):
            sid = str(ids[s]) if s < len(ids) else f"session_{s}"
            when = dates[s] if s < len(dates) else None
            ts = _parse_time(when, _LONGMEMEVAL_TIME)
            for t, turn in enumerate(turns if isinstance(turns, list) else []):
                source, raw = f"{path.name}:{user}/{sid}/{t}", _dump(turn)
                if ts is None:
                    yield "bad", _qrow(user, source, _bad_time(when), raw)
                    continue
                missing = next((f for f in ("role", "content")
                                if not isinstance(turn, dict) or not isinstance(turn.get(f), str)), None)
                if missing:
                    yield "bad", _qrow(user, source, f"missing field: {missing}", raw)
                    continue
                yield "msg", _record(user, sid, f"{sid}:{t}", turn["role"], turn["content"], ts, source, raw)


def _from_mapping(row: dict[str, Any], source: str, raw: str) -> tuple[str, dict[str, Any]]:
    """Validate one generic (jsonl / parquet) row into a message record or a quarantine row."""
    user = row.get("user_id")
    values: dict[str, Any] = {}
    for name in FIELDS:
        value = row.get(name)
        if name == "speaker" and value is None:
            value = row.get("role")
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                return "bad", _qrow(user, source, "bad encoding", raw)
        if name in ("session_id", "message_id") and isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if value is None or (name != "text" and isinstance(value, str) and not value.strip()):
            return "bad", _qrow(user, source, f"missing field: {name}", raw)
        if name != "timestamp" and not isinstance(value, str):
            return "bad", _qrow(user, source, f"invalid field: {name} is {type(value).__name__}", raw)
        if isinstance(value, str) and _has_surrogate(value):
            return "bad", _qrow(user, source, f"lone surrogate in {name}", raw)
        values[name] = value
    ts = _parse_time(values["timestamp"])
    if ts is None:
        return "bad", _qrow(user, source, _bad_time(values["timestamp"]), raw)
    return "msg", _record(values["user_id"], values["session_id"], values["message_id"], values["speaker"],
                          values["text"], ts, source, raw)


def _read_jsonl(path: Path) -> Reader:
    with path.open("rb") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            source = f"{path.name}:line {n}"
            raw = line.decode("utf-8", errors="replace").rstrip("\r\n").lstrip("\ufeff")
            try:
                text = line.decode("utf-8").lstrip("\ufeff")
            except UnicodeDecodeError:
                yield "bad", _qrow(None, source, "bad encoding", raw)
                continue
            try:
                row = json.loads(text)
            except ValueError:
                yield "bad", _qrow(None, source, "invalid json", raw)
                continue
            if not isinstance(row, dict):
                yield "bad", _qrow(None, source, "invalid json: not an object", raw)
                continue
            yield _from_mapping(row, source, raw)


def _read_parquet(path: Path) -> Reader:
    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
        raise IngestError(f"{path.name} is not a Parquet file: {exc}", archive=str(path)) from exc
    names = set(pf.schema_arrow.names)
    missing = [f for f in FIELDS if f not in names and not (f == "speaker" and "role" in names)]
    if missing:
        raise IngestError(f"{path.name} lacks column(s) {', '.join(missing)} (needs {', '.join(FIELDS)})",
                          archive=str(path), missing=missing)
    n = 0
    for batch in pf.iter_batches(batch_size=65536):
        for row in batch.to_pylist():
            yield _from_mapping(row, f"{path.name}:row {n}", _dump(row))
            n += 1


# -- building the batch ---------------------------------------------------------------------------
def read_archive(path: str | Path, fmt: str, *, observations_as_fragments: bool = False) -> ArchiveBatch:
    """Parse one archive into message, session and observation frames plus quarantined rows (no store)."""
    path = Path(path)
    if fmt not in FORMATS:
        raise IngestError(f"unknown archive format {fmt!r} (known: {', '.join(FORMATS)})", format=fmt,
                          known=list(FORMATS))
    if not path.is_file():
        raise IngestError(f"archive not found: {path}", archive=str(path))
    data = _read_json(path) if fmt in ("locomo", "longmemeval") else None
    readers: dict[str, Callable[[], Reader]] = {
        "locomo": lambda: _read_locomo(path, data), "longmemeval": lambda: _read_longmemeval(path, data),
        "jsonl": lambda: _read_jsonl(path), "parquet": lambda: _read_parquet(path),
    }
    records, quarantine = [], []
    seen: dict[tuple[str, str], str] = {}
    read = 0
    for kind, row in readers[fmt]():
        read += 1
        if kind == "bad":
            quarantine.append(row)
        elif not _valid_user(row["user_id"]):
            quarantine.append(_qrow(None, row["source"], "invalid user_id", row["raw"]))
        elif (key := (row["user_id"], row["message_id"])) in seen:
            if seen[key] != row["text"]:
                quarantine.append(_qrow(row["user_id"], row["source"], REUSED_ID, row["raw"]))
        else:
            seen[key] = row["text"]
            records.append(row)
    messages = _messages_frame(records, path.name)
    observations = pl.DataFrame(schema=_OBSERVATIONS)
    if fmt == "locomo" and observations_as_fragments:
        observations, bad = _observations_frame(_locomo_observations(path, data), messages, path.name)
        quarantine.extend(bad)
    sessions = _sessions_frame(messages, observations, path.name)
    log.info("read %s (%s): %d messages read, %d kept, %d sessions, %d observations, %d quarantined",
             path.name, fmt, read, messages.height, sessions.height, observations.height, len(quarantine))
    return ArchiveBatch(archive=path.name, format=fmt, messages=messages, sessions=sessions,
                        observations=observations, quarantine=quarantine, messages_read=read)


def _messages_frame(records: list[dict[str, Any]], archive: str) -> pl.DataFrame:
    if not records:
        return pl.DataFrame(schema=_MESSAGES)
    df = pl.DataFrame(records, schema={k: v for k, v in _MESSAGES.items()
                                       if k not in ("id", "seq", "archive")})
    df = df.with_row_index("_order").sort(["user_id", "session_id", "ts", "_order"])
    df = df.with_columns(
        id=pl.struct("user_id", "message_id").map_elements(
            lambda r: make_id(r["user_id"], r["message_id"]), return_dtype=pl.String),
        seq=pl.int_range(pl.len()).over("user_id", "session_id").cast(pl.Int32),
        archive=pl.lit(archive),
    )
    return df.select(list(_MESSAGES))


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
        if not _valid_user(user):
            bad.append(_qrow(None, item["source"], "invalid user_id", item["raw"]))
            continue
        ids = known.get((user, sid), set())
        sources = list(dict.fromkeys(r for r in item["refs"] if r in ids))
        if not sources:
            reason = "observation cites no message of its session" if ids else "observation of an unknown session"
            bad.append(_qrow(user, item["source"], reason, item["raw"]))
            continue
        oid = make_id(user, sid, item["content"], *sources)
        rows.setdefault(oid, {"id": oid, "user_id": user, "session_id": sid, "subject": item["subject"],
                              "content": item["content"], "source_ids": sources, "archive": archive})
    return pl.DataFrame(list(rows.values()), schema=_OBSERVATIONS), bad


def _sessions_frame(messages: pl.DataFrame, observations: pl.DataFrame, archive: str) -> pl.DataFrame:
    if messages.height == 0:
        return pl.DataFrame(schema=_SESSIONS)
    observed = observations.select("user_id", "session_id").unique().with_columns(observed=pl.lit(True))
    df = (messages.sort("user_id", "session_id", "seq")
          .group_by("user_id", "session_id", maintain_order=True)
          .agg(ts=pl.col("ts").min(), n_messages=pl.len().cast(pl.Int32),
               speakers=pl.col("speaker").unique(maintain_order=True))
          .join(observed, on=["user_id", "session_id"], how="left")
          .with_columns(observed=pl.col("observed").fill_null(False), archive=pl.lit(archive),
                        id=pl.struct("user_id", "session_id").map_elements(
                            lambda r: make_id(r["user_id"], r["session_id"]), return_dtype=pl.String)))
    return df.select(list(_SESSIONS))


# -- writing ------------------------------------------------------------------------------------
def ingest(store: Store, path: str | Path, fmt: str, *, observations_as_fragments: bool = False,
           run_id: str | None = None) -> IngestReport:
    """Read one archive and upsert its new messages, sessions, observations and quarantined rows."""
    start, started_at = time.perf_counter(), datetime.now(timezone.utc)
    run_id = run_id or f"ingest-{started_at:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    batch = read_archive(path, fmt, observations_as_fragments=observations_as_fragments)
    users = sorted(set(batch.messages["user_id"].to_list()))
    quarantine = list(batch.quarantine)

    existing = _existing_messages(store, batch)
    stored = existing.select("user_id", "message_id", _old=pl.col("text"), _stored=pl.lit(True))
    joined = batch.messages.join(stored, on=["user_id", "message_id"], how="left")
    conflicts = joined.filter(pl.col("_stored").fill_null(False) & pl.col("text").ne_missing(pl.col("_old")))
    quarantine += [_qrow(r["user_id"], r["source"], REUSED_ID, r["raw"]) for r in conflicts.iter_rows(named=True)]
    new = _continue_seq(joined.filter(pl.col("_stored").is_null()).drop("_old", "_stored"), existing)

    sessions = _changed_sessions(store, batch, new, existing)
    observations = _new_observations(store, batch.observations)
    q_rows = _new_quarantine(store, quarantine, run_id)

    written = {
        "messages": store.upsert("messages", new.drop("source", "raw").to_arrow()) if new.height else 0,
        "sessions": store.upsert("sessions", sessions.to_arrow()) if sessions.height else 0,
        "observations": store.upsert("observations", observations.to_arrow()) if observations.height else 0,
        "quarantine": store.upsert("quarantine", q_rows) if q_rows else 0,
    }
    log.info("%s: wrote %s", batch.archive, ", ".join(f"{n} {k}" for k, n in written.items()))
    reasons: dict[str, int] = {}
    for q in quarantine:
        reasons[q["reason"]] = reasons.get(q["reason"], 0) + 1
    report = IngestReport(
        archive=batch.archive, format=fmt, users=users, sessions=batch.sessions.height,
        messages_read=batch.messages_read, messages_added=new.height, observations=batch.observations.height,
        quarantined=len(quarantine), reasons=reasons, seconds=time.perf_counter() - start, run_id=run_id)
    counts = {"messages_read": report.messages_read, "messages_added": report.messages_added,
              "sessions": report.sessions, "observations": report.observations,
              "quarantined": report.quarantined, "reasons": reasons, "written": written,
              "archive": batch.archive, "format": fmt}
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


def _existing_messages(store: Store, batch: ArchiveBatch) -> pl.DataFrame:
    """The stored messages this batch touches, read one user at a time (tenant-scoped): those whose
    ids it repeats (to spot a reused id) and those of its sessions (to continue `seq` and recompute
    the session rows). The rest of a user's history is not read."""
    cols = ["message_id", "text", "session_id", "seq", "speaker", "ts"]
    schema = {"user_id": pl.String, "message_id": pl.String, "text": pl.String, "session_id": pl.String,
              "seq": pl.Int32, "speaker": pl.String, "ts": _TS}
    frames = [pl.DataFrame(schema=schema)]
    if store.has_table("messages"):
        for (user,), mine in batch.messages.group_by("user_id"):
            t = store.read("messages", str(user), columns=cols,
                           where=col("id").isin(mine["id"].to_list())
                           | col("session_id").isin(mine["session_id"].unique().to_list()))
            if t.num_rows:
                df = pl.from_arrow(t)
                assert isinstance(df, pl.DataFrame)
                frames.append(df.with_columns(user_id=pl.lit(user)).select(list(schema)).cast(schema))
    return pl.concat(frames)


def _continue_seq(new: pl.DataFrame, existing: pl.DataFrame) -> pl.DataFrame:
    """New messages of a session the store already has go after its stored ones, in their own order."""
    offset = existing.group_by("user_id", "session_id").agg(_off=pl.col("seq").max() + 1)
    return (new.join(offset, on=["user_id", "session_id"], how="left")
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
    fresh = _sessions_frame(union, pl.DataFrame(schema=_OBSERVATIONS), batch.archive)
    observed = {(r["user_id"], r["session_id"]) for r in batch.sessions.filter("observed").iter_rows(named=True)}
    # session ids hash (user, session): reading them by id stays within the batch's users
    stored = {row["id"]: row for row in
              store.read_ids("sessions", fresh["id"].to_list(), columns=list(_SESSIONS)).to_pylist()}
    changed = []
    for row in fresh.iter_rows(named=True):
        old = stored.get(row["id"])
        row["observed"] = (row["user_id"], row["session_id"]) in observed or bool(old and old["observed"])
        if old:
            row["archive"] = old["archive"]
        if old != row:
            changed.append(row)
    return pl.DataFrame(changed, schema=_SESSIONS)


def _new_observations(store: Store, observations: pl.DataFrame) -> pl.DataFrame:
    if observations.height == 0 or not store.has_table("observations"):
        return observations
    have = store.read_ids("observations", observations["id"].to_list(), columns=["id"]).column("id").to_pylist()
    return observations.filter(~pl.col("id").is_in(have))


def _new_quarantine(store: Store, rows: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    """Quarantine rows with their deterministic ids, minus those already set aside by an earlier run."""
    now = datetime.now(timezone.utc)
    by_id = {make_id(r["source"], r["reason"], r["raw"]): r for r in rows}
    if not by_id:
        return []
    have = set(store.read_ids("quarantine", list(by_id), columns=["id"]).column("id").to_pylist())
    return [{**r, "id": qid, "run_id": run_id, "created_at": now} for qid, r in by_id.items() if qid not in have]
