"""Format readers: each turns one archive into ("msg", message record) and ("bad", quarantine row) pairs.

`locomo` and `longmemeval` are JSON files read whole (:func:`read_json`); `jsonl` and `parquet` are
streamed, one row at a time, each row checked for the generic fields (:data:`FIELDS`); their rows'
raw text can be read again by source (:func:`raw_reader`), so a kept row's need not be held. LoCoMo's
observations are read separately (:func:`locomo_observations`), only when asked for. BEAM chats
(one `chat.json` or a folder of them) are read by :mod:`memory.ingest.beam`.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from memory.errors import IngestError
from memory.ingest.beam import read_beam
from memory.ingest.common import (FIELDS, RawOf, Reader, bad_time, dump_raw, has_surrogate, parse_stamp,
                                  parse_time, quarantine_row, record)

__all__ = ["Reader", "NOT_A_LIST", "read_json", "read_rows", "locomo_observations", "from_mapping", "raw_reader"]

_LOCOMO_TIME = "%I:%M %p on %d %B, %Y"          # "1:56 pm on 8 May, 2023"
_LONGMEMEVAL_TIME = "%Y/%m/%d (%a) %H:%M"        # "2023/05/20 (Sat) 02:21"
#: the quarantine reason of a LoCoMo / LongMemEval session that is not a list of turns (kept whole)
NOT_A_LIST = "invalid session: not a list of turns"
#: Parquet rows read at a time
_PARQUET_BATCH = 8192


def read_json(path: Path) -> Any:
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
            yield "bad", quarantine_row(user, f"{path.name}:sample {i}", "missing field: conversation", dump_raw(sample))
            continue
        # the keys as written (`session_01` stays `session_01`), in the order of their numbers
        keys = sorted((int(m.group(1)), k) for k in conv if (m := re.fullmatch(r"session_(\d+)", k)))
        for _, sid in keys:
            turns, when = conv[sid], conv.get(f"{sid}_date_time")
            ts = parse_time(when, _LOCOMO_TIME)
            if not isinstance(turns, list):
                yield "bad", quarantine_row(user, f"{path.name}:{user}/{sid}", NOT_A_LIST, dump_raw(turns))
                continue
            for j, turn in enumerate(turns):
                source, raw = f"{path.name}:{user}/{sid}/{j}", dump_raw(turn)
                if ts is None:
                    yield "bad", quarantine_row(user, source, bad_time(when), raw)
                    continue
                if not isinstance(turn, dict):
                    yield "bad", quarantine_row(user, source, "invalid turn", raw)
                    continue
                missing = next((f for f in ("dia_id", "speaker", "text") if not isinstance(turn.get(f), str)),
                               None)
                if missing:
                    yield "bad", quarantine_row(user, source, f"missing field: {missing}", raw)
                    continue
                text = turn["text"]
                if isinstance(turn.get("blip_caption"), str) and turn["blip_caption"].strip():
                    text = f"{text} [shares an image: {turn['blip_caption'].strip()}]".strip()
                yield "msg", record(user, sid, turn["dia_id"], turn["speaker"], text, ts, source, raw)


def locomo_observations(path: Path, data: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """("obs", {user_id, session_id, subject, content, refs, source, raw}) or ("bad", quarantine row)."""
    for sample in data:
        if not isinstance(sample, dict) or not isinstance(sample.get("observation"), dict):
            continue
        user = sample.get("sample_id")
        for key, by_speaker in sample["observation"].items():
            m = re.fullmatch(r"(session_\d+)_observation", key)
            if not isinstance(by_speaker, dict):
                yield "bad", quarantine_row(user, f"{path.name}:{user}/{key}", "malformed observation: not a "
                                            "mapping of speakers", dump_raw(by_speaker))
                continue
            for speaker, items in by_speaker.items():
                for k, item in enumerate(items if isinstance(items, list) else []):
                    source, raw = f"{path.name}:{user}/{key}/{speaker}/{k}", dump_raw(item)
                    ok = (m and isinstance(item, (list, tuple)) and len(item) >= 2
                          and isinstance(item[0], str) and item[0].strip())
                    if m is None or not ok:
                        yield "bad", quarantine_row(user, source, "malformed observation", raw)
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
            yield "bad", quarantine_row(user, f"{path.name}:item {i}", "missing field: haystack_sessions", dump_raw(item))
            continue
        dates = item.get("haystack_dates") or []
        ids = item.get("haystack_session_ids") or []
        if bad := next((f for f, v in (("haystack_dates", dates), ("haystack_session_ids", ids))
                        if not isinstance(v, list)), None):
            yield "bad", quarantine_row(user, f"{path.name}:item {i}", f"invalid field: {bad} is not a list",
                                        dump_raw(item))
            continue
        for s, turns in enumerate(sessions):
            sid = str(ids[s]) if s < len(ids) else f"session_{s}"
            when = dates[s] if s < len(dates) else None
            ts = parse_time(when, _LONGMEMEVAL_TIME)
            if not isinstance(turns, list):
                yield "bad", quarantine_row(user, f"{path.name}:{user}/{sid}", NOT_A_LIST, dump_raw(turns))
                continue
            for t, turn in enumerate(turns):
                source, raw = f"{path.name}:{user}/{sid}/{t}", dump_raw(turn)
                if ts is None:
                    yield "bad", quarantine_row(user, source, bad_time(when), raw)
                    continue
                missing = next((f for f in ("role", "content")
                                if not isinstance(turn, dict) or not isinstance(turn.get(f), str)), None)
                if missing:
                    yield "bad", quarantine_row(user, source, f"missing field: {missing}", raw)
                    continue
                yield "msg", record(user, sid, f"{sid}:{t}", turn["role"], turn["content"], ts, source, raw)


def from_mapping(row: dict[str, Any], source: str, raw: str) -> tuple[str, dict[str, Any]]:
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
                return "bad", quarantine_row(user, source, "bad encoding", raw)
        if name in ("session_id", "message_id") and isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if value is None or (name != "text" and isinstance(value, str) and not value.strip()):
            return "bad", quarantine_row(user, source, f"missing field: {name}", raw)
        if name != "timestamp" and not isinstance(value, str):
            return "bad", quarantine_row(user, source, f"invalid field: {name} is {type(value).__name__}", raw)
        if isinstance(value, str) and has_surrogate(value):
            return "bad", quarantine_row(user, source, f"lone surrogate in {name}", raw)
        values[name] = value
    stamp = parse_stamp(values["timestamp"])
    if stamp is None:
        return "bad", quarantine_row(user, source, bad_time(values["timestamp"]), raw)
    return "msg", record(values["user_id"], values["session_id"], values["message_id"], values["speaker"],
                          values["text"], stamp[0], source, raw, stamp[1])


def _read_jsonl(path: Path) -> Reader:
    with path.open("rb") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            source = f"{path.name}:line {n}"
            raw = _line_raw(line)
            try:
                text = line.decode("utf-8").lstrip("\ufeff")
            except UnicodeDecodeError:
                yield "bad", quarantine_row(None, source, "bad encoding", raw)
                continue
            try:
                row = json.loads(text)
            except ValueError:
                yield "bad", quarantine_row(None, source, "invalid json", raw)
                continue
            if not isinstance(row, dict):
                yield "bad", quarantine_row(None, source, "invalid json: not an object", raw)
                continue
            yield from_mapping(row, source, raw)


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
    for batch in pf.iter_batches(batch_size=_PARQUET_BATCH):
        for row in _microseconds(batch).to_pylist():
            yield from_mapping(row, f"{path.name}:row {n}", dump_raw(row))
            n += 1


def _microseconds(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` with its nanosecond timestamp columns floored to microseconds (a Python datetime holds
    no nanoseconds; an ISO string's extra digits are dropped the same way), their time zone kept."""
    cols = [pc.floor_temporal(c, unit="microsecond").cast(pa.timestamp("us", c.type.tz))
            if pa.types.is_timestamp(c.type) and c.type.unit == "ns" else c for c in batch.columns]
    return pa.RecordBatch.from_arrays(cols, schema=pa.schema(
        [f.with_type(c.type) for f, c in zip(batch.schema, cols)], metadata=batch.schema.metadata))


def _line_raw(line: bytes) -> str:
    """The raw text of a jsonl line (the line without its end, any BOM, undecodable bytes replaced)."""
    return line.decode("utf-8", errors="replace").rstrip("\r\n").lstrip("\ufeff")


def raw_reader(path: Path, fmt: str) -> RawOf | None:
    """For jsonl and parquet, a function giving the raw text of kept rows (their `source`, `user_id`,
    `message_id` and `text`) as the reader gave it, read again from `path`; IngestError when a row
    no longer holds that message (the file was rewritten since). None for the other formats (their
    rows keep their raw text)."""
    if fmt not in ("jsonl", "parquet"):
        return None

    def raw_of(rows: Iterable[dict[str, Any]]) -> dict[str, str]:
        wanted = {r["source"]: (r["user_id"], r["message_id"], r["text"]) for r in rows}
        if not wanted:
            return {}
        try:
            found = _reread(path, fmt, wanted)
        except (OSError, ValueError, pa.ArrowException):   # gone, no longer readable or parsable
            found = {}
        if wanted.keys() - found.keys():
            raise IngestError(f"{path.name} changed while it was ingested: ingest it again", archive=str(path))
        return found
    return raw_of


def _reread(path: Path, fmt: str, wanted: dict[str, tuple[str, str, str]]) -> dict[str, str]:
    """The raw text of the rows named in `wanted` that still hold its (user, message id, text)."""
    def same(source: str, row: Any, raw: str) -> bool:
        kind, rec = from_mapping(row, source, raw) if isinstance(row, dict) else ("bad", {})
        return kind == "msg" and (rec["user_id"], rec["message_id"], rec["text"]) == wanted[source]

    found: dict[str, str] = {}
    if fmt == "jsonl":
        with path.open("rb") as fh:
            for n, line in enumerate(fh, start=1):
                if (source := f"{path.name}:line {n}") in wanted:
                    raw = _line_raw(line)
                    if same(source, json.loads(line.decode("utf-8").lstrip("\ufeff")), raw):
                        found[source] = raw
        return found
    n = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=_PARQUET_BATCH):
        hits = [i for i in range(batch.num_rows) if f"{path.name}:row {n + i}" in wanted]
        for i, row in zip(hits, _microseconds(batch).take(pa.array(hits, pa.int64())).to_pylist() if hits else []):
            source, raw = f"{path.name}:row {n + i}", dump_raw(row)
            if same(source, row, raw):
                found[source] = raw
        n += batch.num_rows
    return found


def read_rows(path: Path, fmt: str, data: Any, user_id: str | None = None) -> Reader:
    """The reader of `fmt` over `path` (`data`: the parsed JSON of a locomo / longmemeval archive;
    `user_id`: the user of a BEAM chat instead of the one its folders name)."""
    readers: dict[str, Callable[[], Reader]] = {
        "locomo": lambda: _read_locomo(path, data), "longmemeval": lambda: _read_longmemeval(path, data),
        "jsonl": lambda: _read_jsonl(path), "parquet": lambda: _read_parquet(path),
        "beam": lambda: read_beam(path, user_id),
    }
    return readers[fmt]()
