"""Appends: a batch of one user's new turns (an assistant writing what it has just said and heard),
validated exactly like an ingest and written at once; the next consolidation run makes them memory.

Each turn is a mapping with the generic archive fields (`session_id`, `message_id`, `speaker` or
`role`, `text`, `timestamp` in ISO 8601; `user_id` optional and, when given, the call's own). It goes
through the jsonl reader's field checks (`readers.from_mapping`) and the batch checks every ingest
runs (`validate.validate_rows`: user id, lengths, NUL, lone surrogates, an id reused in the batch),
then `write.store_batch` (an id already stored with other text is quarantined, one already stored
with the same text is skipped, new messages of a known session continue its `seq`), under one hold
of the store's writer lease. Bad turns go to `quarantine` and come back in the report with their
index and reason; the rest is written. Re-sending a batch adds nothing.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import polars as pl

from memory.errors import AppendTooLargeError
from memory.ids import new_run_id, validate_user_id
from memory.ingest.common import OBSERVATIONS_SCHEMA, ArchiveBatch, Reader, dump_raw, quarantine_row
from memory.ingest.readers import from_mapping
from memory.ingest.validate import messages_frame, sessions_frame, validate_rows
from memory.ingest.write import store_batch
from memory.settings import RetrievalSettings
from memory.store import Store

__all__ = ["AppendReport", "append", "check_batch", "APPEND_ARCHIVE", "OTHER_USER", "Compactor"]

log = logging.getLogger(__name__)

#: the `archive` of appended messages and sessions (a session first seen in an archive keeps its name)
APPEND_ARCHIVE = "append"
#: the quarantine reason of a turn that names a user other than the call's
OTHER_USER = "user_id differs from the user appended to"


@dataclass
class AppendReport:
    """What one `append` call received, added, skipped as already stored and set aside (with the
    index of each bad turn in the batch, its message id when it had one, and the reason)."""

    user_id: str
    received: int
    added: int
    duplicates: int
    quarantined: list[dict[str, Any]] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        return (f"append {self.user_id}: {self.received} received, {self.added} added, {self.duplicates} already "
                f"stored, {len(self.quarantined)} quarantined; {self.seconds * 1000:.0f} ms")


def check_batch(user_id: str, turns: Sequence[Any], max_messages: int | None = None) -> str:
    """The validated user id of an append batch; InvalidUserIdError for a bad one, AppendTooLargeError
    over `max_messages` turns (default: `RetrievalSettings.append_max_messages`)."""
    user_id = validate_user_id(user_id)
    limit = max_messages or RetrievalSettings().append_max_messages
    if len(turns) > limit:
        raise AppendTooLargeError(f"an append batch carries at most {limit} turns, got {len(turns)}: split it "
                                  "(append_max_messages)", limit=limit, received=len(turns))
    return user_id


def append(store: Store, user_id: str, turns: Sequence[Any], *, max_messages: int | None = None,
           run_id: str | None = None) -> AppendReport:
    """Validate one batch of the user's turns like an ingest and upsert what is new (see the module doc).

    Raises InvalidUserIdError for a bad `user_id` and AppendTooLargeError over `max_messages` turns
    (default: `RetrievalSettings.append_max_messages`); a bad turn is quarantined, never raised."""
    start = time.perf_counter()
    user_id = check_batch(user_id, turns, max_messages)
    run_id = run_id or new_run_id("append")
    sources = {_source(user_id, i): i for i in range(len(turns))}
    records, quarantine, read = validate_rows(_read_turns(user_id, turns))
    messages = messages_frame(records, APPEND_ARCHIVE)
    batch = ArchiveBatch(archive=APPEND_ARCHIVE, format="append", messages=messages,
                         sessions=sessions_frame(messages, pl.DataFrame(schema=OBSERVATIONS_SCHEMA), APPEND_ARCHIVE),
                         observations=pl.DataFrame(schema=OBSERVATIONS_SCHEMA), quarantine=quarantine,
                         messages_read=read)
    done = store_batch(store, batch, run_id)
    bad = [{"index": sources.get(q["source"]), "message_id": _message_id(turns, sources.get(q["source"])),
            "reason": q["reason"]} for q in done.quarantine]
    bad.sort(key=lambda b: (b["index"] if b["index"] is not None else -1))
    return AppendReport(user_id=user_id, received=len(turns), added=done.new.height,
                        duplicates=len(turns) - done.new.height - len(bad), quarantined=bad,
                        sessions=sorted(set(done.new["session_id"].to_list())),
                        seconds=time.perf_counter() - start)


def _source(user_id: str, index: int) -> str:
    return f"{APPEND_ARCHIVE}:{user_id}/{index}"


def _message_id(turns: Sequence[Any], index: int | None) -> str | None:
    if index is None or not isinstance(turns[index], Mapping):
        return None
    value = turns[index].get("message_id")
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        return None
    # escaped when it cannot be encoded (a lone surrogate): the report is JSON, and must still answer
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")


def _read_turns(user_id: str, turns: Sequence[Any]) -> Reader:
    """The batch as a reader's ("msg" | "bad", row) pairs, each turn filed under `user_id`."""
    def rows() -> Iterator[tuple[str, dict[str, Any]]]:
        for i, turn in enumerate(turns):
            source, raw = _source(user_id, i), dump_raw(turn)
            if not isinstance(turn, Mapping):
                yield "bad", quarantine_row(user_id, source, "invalid turn: not an object", raw)
            elif turn.get("user_id", user_id) != user_id:
                yield "bad", quarantine_row(user_id, source, OTHER_USER, raw)
            else:
                yield from_mapping({**turn, "user_id": user_id}, source, raw)
    return rows()


class Compactor:
    """Keeps the tables appends write compact under a stream of small batches (each batch adds a
    data file per table, and every read, the retriever's change checks included, pays per file):
    `appended()` after every batch starts one background `Store.optimize` of `TABLES` every `every`
    batches, never two at once. Meant for a long-lived writer (the service, the MCP server)."""

    TABLES = ("messages", "sessions", "quarantine")

    def __init__(self, store: Store, every: int, min_fragments: int = 8) -> None:
        self.store, self.every, self.min_fragments = store, every, min_fragments
        self._lock = threading.Lock()
        self._count = 0
        self._thread: threading.Thread | None = None

    def append(self, user_id: str, turns: Sequence[Any], *, max_messages: int | None = None) -> AppendReport:
        """`append` one batch to this compactor's store and count it (`appended`) when it added rows:
        what every long-lived writer does per batch."""
        report = append(self.store, user_id, turns, max_messages=max_messages)
        if report.added:
            self.appended()
        return report

    def appended(self) -> None:
        """Count one append batch; start a compaction when `every` batches were counted since the last."""
        with self._lock:
            self._count += 1
            if self.every <= 0 or self._count < self.every or (self._thread and self._thread.is_alive()):
                return
            self._count = 0
            self._thread = threading.Thread(target=self._compact, name="mnemo-compact", daemon=True)
            self._thread.start()

    def _compact(self) -> None:
        start = time.perf_counter()
        done = self.store.optimize(self.TABLES, min_fragments=self.min_fragments)
        log.info("compacted %s after appends in %.0f ms", ", ".join(done) or "nothing",
                 (time.perf_counter() - start) * 1000)

    def join(self, timeout: float | None = None) -> None:
        """Wait for a running compaction (tests, shutdown)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
