"""Appends in a child process of their own, for a long-lived server that also answers reads.

An append is mostly Python and Polars work plus LanceDB scans and commits: in the process that
also serves retrieval it competes with every query for the interpreter lock (measured on a 2-core
machine: batch latency doubled and retrieval p50 rose by a quarter while one client appended 1,000
turns/s). `AppendWorker` runs `memory.ingest.append.append` (and the append `Compactor`) in one
spawned child (a fresh interpreter: no lock, threads or allocator shared with the server, no
embedder loaded) at a lower CPU priority (`nice`): under contention the kernel serves the queries
first and the appends with what is left. Its store is the server's (the same URI, dimension, lease
backend and lifetime; the writer lease spans processes), with its own wait for the lease, so a busy
store answers `StoreBusyError` after `wait_s`, not after the default 30 s.

Each call sends the batch to the child and returns its `AppendReport`; errors (`AppendTooLargeError`,
`InvalidUserIdError`, `StoreBusyError`) come back as themselves; a batch that cannot be pickled for the
child (a turn nested too deep for the pickler: `RecursionError`) fails as `BatchNotSendableError`, the
caller's input, never the worker's fault (the child and the other batches are unaffected). A child that
died (killed, out of memory) is replaced and the batch sent once more (appends are idempotent by message
id). After an append that added rows, the server's own `Store` is told which `messages` version the
child made and for which user (`Store.inserts`, `memory.inserts`), so its retrieval cache keeps every
other user's index without re-reading it.
"""
from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.util
import os
import pickle
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Sequence

from memory.errors import MnemoError, StoreError
from memory.ingest.append import AppendReport, Compactor, check_batch
from memory.store import Store

__all__ = ["AppendWorker", "BatchNotSendableError", "TRACKED_TABLE"]

log = logging.getLogger(__name__)

#: the table appends write that retrieval indexes read (the others, sessions and quarantine, are not)
TRACKED_TABLE = "messages"

#: a noted insert as the child sends it back: (version before, version after, users), or None
Noted = tuple[int, int, frozenset[str]] | None


class BatchNotSendableError(MnemoError):
    """A batch could not be pickled for the worker process: a turn is nested too deep (`RecursionError`)
    or holds what pickle refuses. The caller's input: a service answers 422."""


# the child's own store and compactor (set by `_start`, in the child only)
_CHILD: dict[str, Any] = {}


def _start(uri: str, dim: int, wait_s: float, backend: str, ttl_s: float, compact_every: int, nice: int) -> None:
    """In the child: lower its priority and open its store."""
    if nice > 0 and hasattr(os, "nice"):
        os.nice(nice)
    # no read-consistency interval: like the server's own handle, it checks out the latest version once per
    # read and write, not on every table access (an interval of 0 re-reads the manifest each time)
    store = Store(uri, dim, consistency_s=None, write_lease_wait_s=wait_s, lease_backend=backend, lease_ttl_s=ttl_s)
    compactor = Compactor(store, compact_every)
    _CHILD.update(store=store, compactor=compactor)
    multiprocessing.util.Finalize(None, compactor.join, exitpriority=10)   # a compaction ends before exit


def _ready() -> int:
    return os.getpid()


def _append(user_id: str, turns: Sequence[Any], max_messages: int) -> tuple[AppendReport, Noted]:
    """In the child: one append, with the `messages` insert its store noted (`Store.inserts.last`:
    versions before and after, and users) when it added rows."""
    report = _CHILD["compactor"].append(user_id, turns, max_messages=max_messages)
    store: Store = _CHILD["store"]
    return report, store.inserts.last(TRACKED_TABLE) if report.added else None


class AppendWorker:
    """One child process that writes the appends of a server's store (see the module doc); started by
    `start()` or the first append, stopped by `close()` (or at interpreter exit)."""

    def __init__(self, store: Store, *, wait_s: float, compact_every: int, nice: int = 0) -> None:
        self.store, self.wait_s, self.compact_every, self.nice = store, wait_s, compact_every, nice
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                s = self.store
                self._pool = ProcessPoolExecutor(
                    max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=_start,
                    initargs=(s.uri, s.dim, self.wait_s, s.lease_backend, s.lease_ttl_s, self.compact_every,
                              self.nice))
            return self._pool

    def start(self) -> None:
        """Start the child now, without waiting for it (a server's start-up: the first append does
        not wait ~2 s for the child's imports)."""
        self._executor().submit(_ready)

    def pid(self) -> int:
        """The child's process id (starts it)."""
        return int(self._executor().submit(_ready).result())

    def submit(self, user_id: str, turns: Sequence[Any], max_messages: int) -> Future[AppendReport]:
        """Send one batch to the child; the future holds its report (or its error). A bad user id or
        too many turns are refused here, before anything is sent."""
        user_id = check_batch(user_id, turns, max_messages)
        done: Future[AppendReport] = Future()
        done.set_running_or_notify_cancel()   # a caller that gives up (a dropped request) cannot cancel it
        self._send(done, user_id, list(turns), max_messages, retry=True)
        return done

    def append(self, user_id: str, turns: Sequence[Any], max_messages: int) -> AppendReport:
        """`submit`, waiting for the report."""
        return self.submit(user_id, turns, max_messages).result()

    def _send(self, done: Future[AppendReport], user_id: str, turns: list[Any], max_messages: int,
              retry: bool) -> None:
        pool = self._executor()
        try:
            sent = pool.submit(_append, user_id, turns, max_messages)
        except (BrokenProcessPool, RuntimeError) as exc:
            self._died(done, pool, exc, user_id, turns, max_messages, retry)
            return

        def finished(f: Future[tuple[AppendReport, Noted]]) -> None:
            exc = f.exception()
            if isinstance(exc, BrokenProcessPool):
                self._died(done, pool, exc, user_id, turns, max_messages, retry)
            elif isinstance(exc, (RecursionError, pickle.PicklingError)):
                # the pool's feeder thread could not pickle the batch (nothing reached the child)
                done.set_exception(BatchNotSendableError(
                    f"the batch of {len(turns)} turns cannot be sent to the append worker process ({exc}): a "
                    "turn is nested too deep; send flat turns (session_id, message_id, speaker, text, timestamp)",
                    user_id=user_id, reason=type(exc).__name__))
            elif exc is not None:
                done.set_exception(exc)
            else:
                report, noted = f.result()
                if noted is not None:
                    self.store.inserts.note(TRACKED_TABLE, *noted)
                done.set_result(report)

        sent.add_done_callback(finished)

    def _died(self, done: Future[AppendReport], pool: ProcessPoolExecutor, exc: BaseException, user_id: str,
              turns: list[Any], max_messages: int, retry: bool) -> None:
        """The child died: replace it and send the batch once more (idempotent), else fail the call."""
        with self._lock:
            if self._pool is pool:
                self._pool = None
        pool.shutdown(wait=False, cancel_futures=True)
        if not retry:
            done.set_exception(StoreError(f"the append worker process died twice in a row ({exc}); retry the "
                                          "batch", uri=self.store.uri))
            return
        log.warning("the append worker process died (%s): starting another and sending the batch again", exc)
        try:
            self._send(done, user_id, turns, max_messages, retry=False)
        except BaseException as err:   # never leave the caller's future unresolved
            done.set_exception(err)

    def close(self) -> None:
        """Stop the child after the batches it holds (and a compaction it runs)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=False)
