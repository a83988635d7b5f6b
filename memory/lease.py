"""Store leases: one writer per store across processes, and one consolidation run at a time.

Two leases per store, each an OS file lock (`fcntl.flock`, exclusive) on its own file (a lease row on
object stores, see below):

- the **writer lease** (`.mnemo-write.lock`) is taken by every write of `memory.store.Store` (upsert,
  delete, drop_table, optimize) for the duration of that one write, so appends, feedback and ingests
  from other processes go in between a consolidation's commits instead of racing them (two processes
  `merge_insert`-ing the same new ids at once both insert: lancedb#2463, lance#4585). A caller may
  hold it across several writes to make them one unit for other writers (`Store.write_lease()`;
  `Store.unit()` makes them one for readers too, `memory.units`); readers never take it.
- the **run lease** (`.mnemo-run.lock`) is held by `mnemo consolidate` / `backfill` (and
  `memory.runs.consolidate`) for the whole run: a second run waits up to `Settings.run_lease_wait_s`,
  then raises `RunInProgressError` (the CLI exits 75). It does not block writes.

Both are re-entrant within the thread that holds them and exclusive between threads and processes.
The OS drops an flock when its holder dies (`kill -9` included), so a dead holder never leaves the
store locked: the next writer or run gets the lease at once. A holder writes `pid host since` into
the file, read back only to name it in errors.

Where the leases live (`backend`, `Settings.lease_backend`):

- `file` (the default for a local store directory, a plain path or `file://`): lock files inside it.
- `row` (the default for object-store URIs: `s3://`, `gs://`, `az://`, ...; selectable on a local
  directory too): a row with an expiry in the store's own `leases` table, taken and renewed through
  Lance's conditional commit (`memory.lease_row`, which documents its guarantees): it excludes
  writers on different hosts; a dead holder blocks the others for at most `Settings.lease_ttl_s`.
- `memory://`: in-process only (threads of the one process that can see it exclude each other).
"""
from __future__ import annotations

import hashlib
import os
import socket
import tempfile
import threading
import time
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: leases are in-process only there
    fcntl = None  # type: ignore[assignment]

from memory.errors import ConfigError, MnemoError, RunInProgressError, StoreBusyError, StoreError
from memory.lease_reentrant import ReentrantLease
from memory.lease_row import LEASE_TTL_S, RowLease

#: the lock file of each lease, inside a local store directory
LOCK_FILES = {"write": ".mnemo-write.lock", "run": ".mnemo-run.lock"}
#: how long a write waits for the writer lease by default (`Settings.write_lease_wait_s`)
WRITE_LEASE_WAIT_S = 30.0
#: how long a run waits for the run lease by default (`Settings.run_lease_wait_s`)
RUN_LEASE_WAIT_S = 0.0
#: longest sleep between two tries of a held lock
_MAX_POLL_S = 0.02
#: the width of the `pid host since` stamp a holder writes into the lock file
_STAMP_BYTES = 160


def is_local(uri: str) -> bool:
    """Whether `uri` names a local directory (a plain path or `file://`)."""
    return "://" not in uri or uri.startswith("file://")


def lock_path(uri: str, kind: str) -> Path | None:
    """The lock file of lease `kind` ("write" or "run") of the store at `uri`; None for `memory://`."""
    name = LOCK_FILES[kind]
    if uri.startswith("memory://"):
        return None
    if is_local(uri):
        return Path(uri.removeprefix("file://")) / name
    key = hashlib.sha256(uri.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"mnemo-leases-{key}" / name


class Lease(ReentrantLease):
    """An exclusive lock on one file: re-entrant in the holding thread, exclusive between threads of a
    process (a mutex) and between processes (`flock`, dropped by the OS when the holder dies)."""

    def __init__(self, path: Path | None) -> None:
        super().__init__()
        self.path = path
        self._fd: int | None = None

    def take_first(self, deadline: float) -> bool:
        if self.path is None or fcntl is None:
            return True                              # memory:// (or no flock): the mutex alone
        fd = self._lock_file(deadline)
        if fd is None:
            return False
        self._fd = fd
        return True

    def release_last(self) -> None:
        if self._fd is not None and fcntl is not None:
            fd, self._fd = self._fd, None
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def where(self) -> dict[str, Any]:
        return {"path": str(self.path)}

    def _lock_file(self, deadline: float) -> int | None:
        assert self.path is not None and fcntl is not None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot open the lock file {self.path}: {exc}", path=str(self.path)) from exc
        pause = 0.0005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    os.close(fd)
                    return None
                time.sleep(min(pause, left))
                pause = min(pause * 2, _MAX_POLL_S)
            except BaseException:
                os.close(fd)
                raise
        # a fixed-width stamp written in place: truncating first costs a data flush on ext4 (~3 ms)
        stamp = f"{os.getpid()} {socket.gethostname()} {datetime.now(timezone.utc).isoformat(timespec='seconds')}"
        os.pwrite(fd, stamp.encode()[:_STAMP_BYTES - 1].ljust(_STAMP_BYTES - 1) + b"\n", 0)
        return fd

    def holder(self) -> str:
        """Who last took the lease, as `pid P on HOST since T` ("" when unknown)."""
        try:
            pid, host, since = (self.path.read_text().split() + ["", "", ""])[:3] if self.path else ("", "", "")
        except OSError:
            return ""
        return f"pid {pid} on {host} since {since}" if pid else ""

    def reset_after_fork(self) -> None:
        """In a forked child: the parent's holds are not the child's (its copy of the fd is closed;
        closing a copy never drops the parent's flock)."""
        super().reset_after_fork()
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None


_LEASES: dict[tuple[str, str, str], Lease | RowLease] = {}
_LEASES_GUARD = threading.Lock()


#: lease backends (`Settings.lease_backend`)
BACKENDS = ("auto", "file", "row")


def store_key(uri: str) -> str:
    """One name per store, whatever the spelling of its URI (absolute path for local directories)."""
    uri = str(uri)
    return os.path.abspath(uri.removeprefix("file://")) if is_local(uri) else uri.rstrip("/")


def backend_for(uri: str, backend: str = "auto") -> str:
    """The lease backend of the store at `uri`: `auto` is `file` for local directories and
    `memory://`, `row` for object-store URIs."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown lease backend {backend!r} (known: {', '.join(BACKENDS)})", backend=backend)
    if backend == "auto":
        return "file" if is_local(uri) or str(uri).startswith("memory://") else "row"
    return backend


def lease(uri: str, kind: str, backend: str = "auto", ttl_s: float = LEASE_TTL_S) -> Lease | RowLease:
    """The process-wide lease `kind` of the store at `uri` (one object per store and backend, whatever
    the number of `Store` handles opened on it)."""
    where = store_key(uri)
    chosen = backend_for(where, backend)
    with _LEASES_GUARD:
        found = _LEASES.get((where, kind, chosen))
        if found is None:
            found = _LEASES[(where, kind, chosen)] = (
                Lease(lock_path(where, kind)) if chosen == "file" else RowLease(where, kind, ttl_s))
        return found


def _after_fork() -> None:
    global _LEASES_GUARD
    _LEASES_GUARD = threading.Lock()
    for held in _LEASES.values():
        held.reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def write_lease(uri: str, wait_s: float = WRITE_LEASE_WAIT_S, backend: str = "auto",
                ttl_s: float = LEASE_TTL_S) -> AbstractContextManager[None]:
    """Hold the writer lease of the store at `uri` for a block (raises `StoreBusyError` after `wait_s`)."""
    return hold_write(lease(uri, "write", backend, ttl_s), uri, wait_s)


def hold_write(held: Lease | RowLease, uri: str, wait_s: float = WRITE_LEASE_WAIT_S) -> AbstractContextManager[None]:
    """`write_lease` with the writer lease `held` already looked up (`lease(uri, "write", ...)`): a
    `Store` needs the object itself too, and so looks it up once per write, not twice."""
    def busy() -> MnemoError:
        who = held.holder()
        return StoreBusyError(
            f"store {uri} is busy: another writer held its write lease for over {wait_s:g}s"
            + (f" ({who})" if who else "") + "; retry later, or raise "
            "MNEMO_WRITE_LEASE_WAIT_S (in `mnemo serve` / `mnemo mcp`: MNEMO_RETRIEVAL_WRITE_WAIT_S)",
            uri=uri, wait_s=wait_s, holder=who)

    return held.hold(wait_s, busy)


def run_lease(uri: str, wait_s: float = RUN_LEASE_WAIT_S, backend: str = "auto",
              ttl_s: float = LEASE_TTL_S) -> AbstractContextManager[None]:
    """Hold the run lease of the store at `uri` for a whole consolidation (raises `RunInProgressError`
    when another run still holds it after `wait_s`)."""
    held = lease(uri, "run", backend, ttl_s)

    def running() -> MnemoError:
        who = held.holder()
        return RunInProgressError(
            f"skipped: a consolidation run is still in progress on store {uri}"
            + (f" ({who})" if who else "") + f"; waited {wait_s:g}s (run_lease_wait_s)",
            uri=uri, wait_s=wait_s, holder=who)

    return held.hold(wait_s, running)
