"""Prefect's temporary API server, kept from outliving a run killed with `kill -9`.

With no `PREFECT_API_URL`, Prefect 3.8 starts one temporary API server per process on first use
(`prefect.server.api.server.SubprocessASGIServer`: a `python -m uvicorn ...
prefect.server.api.server:create_app` child on a random port in 8000-8999) and stops it from an
`atexit` hook. A process killed with `kill -9` runs no hook: its server is re-parented and keeps
running, one more per killed run.

mnemo cleans up rather than reuses (a server reused across processes would serve runs whose owner
may be killed mid-run of another, and Prefect offers no way to hand a running ephemeral server to a
new process): `run_flow` starts the temporary server itself before the flow (the very singleton
Prefect would start, so Prefect uses it) and records it in `<temp dir>/mnemo-prefect-servers/<server
pid>` as `<server pid> <owner pid>`; every run first stops the recorded servers whose owner is dead,
after checking that the pid still runs Prefect's server (its command line: a reused pid is left
alone). A clean exit removes the record (Prefect's own hook stops the server). With `PREFECT_API_URL`
set (a dedicated server, the test harness) nothing is started or recorded here. Reaping reads
`/proc`: on systems without it, recorded servers are left running.
"""
from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

log = logging.getLogger(__name__)

#: what the command line of Prefect's temporary server contains
SERVER_MARK = b"prefect.server.api.server:create_app"


def records_dir() -> Path:
    """Where temporary servers are recorded (one file per server)."""
    return Path(tempfile.gettempdir()) / "mnemo-prefect-servers"


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by its parent, counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _is_server(pid: int) -> bool:
    """Whether `pid` is Prefect's temporary API server (False when it cannot be told)."""
    try:
        return SERVER_MARK in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def reap_orphans(wait_s: float = 5.0) -> list[int]:
    """Stop the recorded temporary servers whose owning process is dead; returns their pids."""
    folder = records_dir()
    if not folder.is_dir():
        return []
    stopped = []
    for record in folder.iterdir():
        try:
            server, owner = (int(v) for v in record.read_text().split()[:2])
        except (OSError, ValueError):
            continue
        if alive(owner):
            continue
        if alive(server) and _is_server(server):
            log.warning("stopping Prefect's temporary server (pid %d) left by dead run process %d",
                        server, owner)
            _stop(server, wait_s)
            stopped.append(server)
        record.unlink(missing_ok=True)
    return stopped


def _stop(pid: int, wait_s: float) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@contextmanager
def quiet_children(module: Any) -> Iterator[None]:
    """While the block runs, a process `module` starts with `subprocess.Popen` gets no stdin and
    writes to `server.log` in `records_dir()` instead of this process's stdout and stderr: Prefect
    starts its server inheriting them, and a server outliving its run killed with `kill -9` kept
    the caller's pipe open (`mnemo consolidate | tee log` hung until the next run reaped it)."""
    real = module.subprocess
    records_dir().mkdir(parents=True, exist_ok=True)
    with open(records_dir() / "server.log", "ab") as log_file:
        def popen(*args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
            kwargs.setdefault("stdin", subprocess.DEVNULL)
            kwargs.setdefault("stdout", log_file)
            kwargs.setdefault("stderr", log_file)
            return real.Popen(*args, **kwargs)

        module.subprocess = SimpleNamespace(**{**vars(real), "Popen": popen})
        try:
            yield
        finally:
            module.subprocess = real


def start_recorded() -> int | None:
    """Start Prefect's temporary server for this process now (when Prefect would use one: no
    `PREFECT_API_URL`, ephemeral mode allowed) and record it; returns its pid (None otherwise)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return None
    import prefect.server.api.server as prefect_server

    server = prefect_server.SubprocessASGIServer()
    with quiet_children(prefect_server):
        server.start()
    if server.server_process is None:
        return None
    pid = server.server_process.pid
    record = records_dir() / str(pid)
    if not record.exists():
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(f"{pid} {os.getpid()}\n")
        atexit.register(record.unlink, missing_ok=True)
    return pid
