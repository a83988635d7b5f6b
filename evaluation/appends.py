"""`mnemo bench appends`: live appends over HTTP while another user is being served.

A store with one consolidated archive (default: the shipped sample) is served by the real service
(`mnemo serve`, a uvicorn subprocess on loopback, so the clients never share its interpreter; the
writers run in a process of their own too, so the reader's timings never wait for their JSON work). For
`seconds`, `writers` clients post batches of `batch` turns for a new user each (`append-bench-*`,
a new session every `session_batches` batches), together at `rate` messages/s (the target's rate; a
batch that is late goes at once; 0: as fast as the service answers), while one client retrieves for
the archive's first user (`reader_of`: never an append user a run before left in a reused `store`;
`readers`: how many such clients). Printed: sustained messages/s (turns of
the batches sent within the `seconds` window / `seconds`),
append batch latency, retrieval p50 / p99 (ms, measured by the client, so HTTP included), and
whether every turn was stored once. Targets (issue 12): ≥ 1,000 messages/s with batches of 100 and
retrieval p99 < 50 ms.
"""
from __future__ import annotations

import itertools
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from memory.errors import ConfigError
from memory.ingest import ingest
from memory.runs import consolidate, open_store
from memory.settings import Settings
from memory.store import Store

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sample.jsonl"
#: the writers' user ids start so (a run's are new; a reused store keeps earlier runs')
APPEND_PREFIX = "append-bench-"
#: the service must answer /healthz within this long (it loads the embedder first)
START_TIMEOUT_S = 180.0


def bench_appends(archive: str | None = None, fmt: str = "jsonl", *, seconds: float = 10.0, batch: int = 100,
                  writers: int = 1, readers: int = 1, session_batches: int = 5, store: str | None = None,
                  settings: Settings | None = None, rate: float = 1000.0) -> str:
    """Build (or reuse) a consolidated store, serve it, run the writers and the reader, report."""
    base = settings or Settings()
    with tempfile.TemporaryDirectory(prefix="mnemo-appends-") as tmp:
        root = store or str(Path(tmp) / "store")
        cfg = base.model_copy(update={"store": root, "llm": "rules"})
        st = open_store(cfg)
        path = str(archive or SAMPLE)
        t0 = time.perf_counter()
        if not st.has_table("watermarks") or st.read("watermarks").num_rows == 0:
            ingest(st, path, fmt)
            consolidate(st, cfg)
        build_s = time.perf_counter() - t0
        reader_user = reader_of(st.users())
        texts = [t for t in st.read("messages", columns=["text"]).column("text").to_pylist() if t][:2000]
        queries = [t[:300] for t in st.read("messages", reader_user, columns=["text"]).column("text").to_pylist()
                   if t and t.strip()][:200]
        log_path = Path(tmp) / "serve.log"
        users = [f"{APPEND_PREFIX}{uuid.uuid4().hex[:6]}-{w}" for w in range(writers)]   # new ones on a reused store
        with _server(root, log_path) as srv:
            cpu0 = srv.cpu_s()
            result = _run(srv.url, texts, queries, reader_user, users, seconds=seconds, batch=batch,
                          session_batches=session_batches, readers=readers, rate=rate)
            result["server_cpu_s"] = srv.cpu_s() - cpu0
        stored = _count(st, users)
    return _report(result, stored, build_s=build_s, archive=Path(path).name, reader=reader_user, batch=batch,
                   writers=writers, readers=readers, rate=rate)


def reader_of(users: list[str]) -> str:
    """The archive's first user: the first that is no bench writer's (an earlier run on a reused
    store leaves its `append-bench-*` users, never consolidated, and they may sort first)."""
    archive = [u for u in users if not u.startswith(APPEND_PREFIX)]
    if not archive:
        raise ConfigError(f"the store holds no user but the bench's own ({APPEND_PREFIX}*) to read",
                          users=len(users))
    return archive[0]


class _server:
    """`mnemo serve` on a free loopback port in a subprocess, until the block ends."""

    def __init__(self, store: str, log_path: Path) -> None:
        self.store, self.log_path = store, log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def cpu_s(self) -> float:
        """CPU seconds the service used so far (user + system, all threads, its child processes
        included: the append worker; Linux /proc)."""
        return sum(_cpu_s(pid) for pid in _tree(self.proc.pid)) if self.proc else float("nan")

    def __enter__(self) -> "_server":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.log = self.log_path.open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "--store", self.store, "serve",
                                      "--host", "127.0.0.1", "--port", str(port)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited: {self.log_path.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    self.url = url
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("the service did not start")

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def _run(url: str, texts: list[str], queries: list[str], reader_user: str, users: list[str], *, seconds: float,
         batch: int, session_batches: int, readers: int = 1, rate: float = 0.0) -> dict[str, Any]:
    """The writers (in a process of their own: their JSON work never delays the reader's clock) and
    the readers (threads here), started together after a warm-up; their figures."""
    stop = threading.Event()
    errors: list[str] = []
    retrieve_ms: list[float] = []   # list.append is atomic: the readers share it
    served_ms: list[float] = []     # the service's own embed + search time of each query (its timings)
    index_ms: list[float] = []      # of which getting the user's index (the version check, a renewal)

    def reader() -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            for q in itertools.cycle(queries):
                if stop.is_set():
                    return
                t = time.perf_counter()
                res = c.post(f"/v1/users/{reader_user}/retrieve", json={"query": q, "k": 10})
                retrieve_ms.append((time.perf_counter() - t) * 1000)
                if res.status_code != 200:
                    errors.append(f"retrieve {res.status_code}: {res.text[:200]}")
                    continue
                timings = res.json()["signals"].get("timings", {})
                served_ms.append(timings.get("embed_ms", 0.0) + timings.get("retrieve_ms", 0.0))
                index_ms.append(timings.get("load_ms", 0.0))

    with httpx.Client(base_url=url, timeout=600) as c:   # warm: the reader's index, the query embedder
        for q in queries[:5]:
            c.post(f"/v1/users/{reader_user}/retrieve", json={"query": q, "k": 10})
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(time.time).result()                     # the writers' process is up
        start_at = time.time() + 0.5
        written = pool.submit(_writers, url, texts, users, start_at=start_at, seconds=seconds, batch=batch,
                              session_batches=session_batches, rate=rate)
        time.sleep(max(0.0, start_at - time.time()))
        t0 = time.perf_counter()
        run_for([threading.Thread(target=reader, daemon=True) for _ in range(readers)], seconds, stop)
        w = written.result(timeout=300)
        wall = max(time.perf_counter() - t0, w["wall"])
    return {"wall": wall, "window": seconds, "added": w["added"], "batch_ms": w["batch_ms"],
            "retrieve_ms": retrieve_ms, "served_ms": served_ms, "index_ms": index_ms, "errors": w["errors"] + errors}


def run_for(threads: list[threading.Thread], seconds: float, stop: threading.Event) -> None:
    """Start `threads`, let them run `seconds`, then set `stop` and wait for them."""
    for th in threads:
        th.start()
    time.sleep(seconds)
    stop.set()
    for th in threads:
        th.join(timeout=120)


def _writers(url: str, texts: list[str], users: list[str], *, start_at: float, seconds: float, batch: int,
             session_batches: int, rate: float) -> dict[str, Any]:
    """One thread per user posting batches from `start_at` (wall clock) for `seconds`, together at
    `rate` messages/s (0: as fast as answered); what they added, their latencies and errors."""
    writers = len(users)
    added = [0] * writers
    batch_ms: list[list[float]] = [[] for _ in range(writers)]
    errors: list[str] = []
    start_ts = datetime(2025, 1, 1, tzinfo=timezone.utc)
    every = batch * writers / rate if rate > 0 else 0.0     # seconds between one writer's batches
    stop = threading.Event()
    time.sleep(max(0.0, start_at - time.time()))
    began = time.perf_counter()

    def writer(w: int) -> None:
        user = users[w]
        with httpx.Client(base_url=url, timeout=60) as c:
            for b in itertools.count():
                if every:    # paced: batch b is due at b * every (a late one goes at once)
                    due = (b + w / writers) * every
                    if due >= seconds:
                        return
                    stop.wait(max(0.0, began + due - time.perf_counter()))
                if stop.is_set():
                    return
                turns = [{"session_id": f"live-{b // session_batches}", "message_id": f"w{w}-b{b}-{i}",
                          "speaker": "user" if i % 2 == 0 else "assistant",
                          "text": texts[(b * batch + i) % len(texts)],
                          "timestamp": (start_ts + timedelta(seconds=b * batch + i)).isoformat()}
                         for i in range(batch)]
                t = time.perf_counter()
                res = c.post(f"/v1/users/{user}/messages", json={"messages": turns})
                batch_ms[w].append((time.perf_counter() - t) * 1000)
                if res.status_code != 200:
                    errors.append(f"append {res.status_code}: {res.text[:200]}")
                    continue
                added[w] += res.json()["added"]   # every batch counted was sent within the window

    run_for([threading.Thread(target=writer, args=(w,), daemon=True) for w in range(writers)], seconds, stop)
    return {"wall": time.perf_counter() - began, "added": sum(added), "batch_ms": [x for xs in batch_ms for x in xs],
            "errors": errors}


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def _tree(root: int) -> list[int]:
    """`root` and every live process below it (Linux /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += parents.get(pid, [])
    return out


def _count(store: Store, users: list[str]) -> dict[str, int]:
    out = {}
    for u in users:
        t = store.read("messages", u, columns=["message_id"])
        ids = t.column("message_id").to_pylist()
        out[u] = len(ids) - len(set(ids))   # duplicates
        out[u + ":rows"] = len(ids)
    return out


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def _report(r: dict[str, Any], stored: dict[str, int], *, build_s: float, archive: str, reader: str, batch: int,
            writers: int, readers: int, rate: float = 0.0) -> str:
    rows = sum(v for k, v in stored.items() if k.endswith(":rows"))
    dupes = sum(v for k, v in stored.items() if not k.endswith(":rows"))
    achieved = r["added"] / r["window"] if r["window"] else 0.0
    cpu = r.get("server_cpu_s", float("nan"))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    p99 = _pct(r["retrieve_ms"], 99)
    if r["retrieve_ms"]:
        retrieval_target = "met" if p99 < 50 else "MISSED"
    else:   # nothing to judge: `--readers 0` measures appends alone
        retrieval_target = "n/a (no reader)" if readers == 0 else "n/a (no query answered)"
    lines = [
        f"appends over HTTP on loopback: {writers} writer(s), batches of {batch}, "
        f"{f'offered at {rate:,.0f} messages/s' if rate > 0 else 'as fast as answered'}, {r['wall']:.1f} s; "
        f"{readers} reader(s): user {reader} of {archive} (store built in {build_s:.1f} s)",
        "| figure | value |", "| --- | --- |",
        f"| **sustained appends** | **{achieved:,.0f} messages/s** ({r['added']:,} turns, "
        f"{len(r['batch_ms'])} batches) |",
        f"| append batch latency p50 / p99 | {_pct(r['batch_ms'], 50):.1f} / {_pct(r['batch_ms'], 99):.1f} ms |",
        f"| **retrieval p50 / p99 meanwhile** | **{_pct(r['retrieve_ms'], 50):.1f} / "
        f"{_pct(r['retrieve_ms'], 99):.1f} ms** ({len(r['retrieve_ms'])} queries) |",
        f"| of which in the service: embed + search p50 / p99; its index p99 | {_pct(r['served_ms'], 50):.1f} / "
        f"{_pct(r['served_ms'], 99):.1f} ms; {_pct(r['index_ms'], 99):.1f} ms |",
        f"| service CPU meanwhile (all its threads and processes) | {cpu:.1f} s = {cpu / r['wall']:.2f} cores; "
        f"{r['added'] / cpu if cpu else float('nan'):,.0f} messages per service CPU-second, retrieval included |",
        f"| machine load average (1 min) | {load:.1f} on {os.cpu_count()} cores |",
        f"| stored / duplicated rows | {rows:,} / {dupes} |",
        f"| errors | {len(r['errors'])}{': ' + r['errors'][0] if r['errors'] else ''} |",
        f"targets: >= 1,000 messages/s {'met' if achieved >= 1000 else 'MISSED'}; retrieval p99 < 50 ms "
        f"{retrieval_target}",
    ]
    return "\n".join(lines)
