"""The bookkeeping both kinds of lease share (`memory.lease.Lease`, a file lock; `memory.lease_row.RowLease`,
a lease row): re-entrant in the holding thread, exclusive between threads of a process (a mutex held
as long as the lease is), with the first take and the last release of the underlying lock left to
the subclass."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from memory.errors import MnemoError

__all__ = ["ReentrantLease"]


class ReentrantLease:
    """A lease held by one thread at a time, any number of times over; the subclass takes the
    underlying lock on the outermost `acquire` (`take_first`) and gives it back on the outermost
    `release` (`release_last`)."""

    def __init__(self) -> None:
        self._mutex = threading.RLock()
        self._depth = 0

    # -- what a kind of lease provides ------------------------------------------------------------
    def take_first(self, deadline: float) -> bool:
        """Take the underlying lock by `deadline` (time.monotonic); False when another holder kept it."""
        raise NotImplementedError

    def release_last(self) -> None:
        """Give the underlying lock back."""
        raise NotImplementedError

    def where(self) -> dict[str, Any]:
        """The lease's location, for error messages (`path=` or `uri=`)."""
        raise NotImplementedError

    # -- shared -----------------------------------------------------------------------------------
    def acquire(self, wait_s: float) -> bool:
        """Take the lease, waiting up to `wait_s` seconds; False when another holder kept it."""
        deadline = time.monotonic() + max(0.0, wait_s)
        if not self._mutex.acquire(timeout=max(0.0, wait_s)):
            return False
        if self._depth == 0:
            try:
                taken = self.take_first(deadline)
            except BaseException:
                self._mutex.release()
                raise
            if not taken:
                self._mutex.release()
                return False
        self._depth += 1
        return True

    def release(self) -> None:
        """Give one level of the lease back (the underlying lock when the outermost holder releases)."""
        if self._depth <= 0:
            raise MnemoError("lease released more often than taken", **self.where())
        self._depth -= 1
        try:
            if self._depth == 0:
                self.release_last()
        finally:
            self._mutex.release()

    def held(self) -> bool:
        """Whether this thread holds the lease."""
        if not self._mutex.acquire(blocking=False):
            return False
        try:
            return self._depth > 0
        finally:
            self._mutex.release()

    @contextmanager
    def hold(self, wait_s: float, error: Callable[[], MnemoError]) -> Iterator[None]:
        """Hold the lease for a block; raise `error()` when it cannot be had within `wait_s`."""
        if not self.acquire(wait_s):
            raise error()
        try:
            yield
        finally:
            self.release()

    def reset_after_fork(self) -> None:
        """In a forked child: the parent's holds are not the child's (subclasses drop their handles too)."""
        self._mutex = threading.RLock()
        self._depth = 0
