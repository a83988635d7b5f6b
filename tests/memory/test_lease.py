"""One writer per store across processes (memory.lease), with real processes on a real LanceDB store:
two processes upserting the same new ids at one instant leave no duplicate (and do without the lease),
a holder killed with `kill -9` never leaves the store locked, a second consolidation while a run holds
the run lease exits 75, writes go through while a run holds it, and a killed run's temporary Prefect
server is stopped by the next run. `memory.doctor` checks the store after every concurrency test."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Iterator

import pytest
from typer.testing import CliRunner

from flows.cli import app
from memory.doctor import check, duplicate_ids
from memory.errors import RunInProgressError, StoreBusyError
from memory.lease import lease, lock_path, run_lease, write_lease
from memory.store import Store
from tests.helpers import REPO

#: a writer process: opens the store of each trial, says "ready", upserts the same 500 new fragment
#: ids when told "go", says "done"; argv: root, trials, lease (1) or not (0), lease backend
RACER = """
import contextlib, sys
import numpy as np
from memory.store import Store
root, trials, lease, backend = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
if not lease:
    Store.write_lease = lambda self: contextlib.nullcontext()
rng = np.random.default_rng(0)
rows = [{"id": f"frag-{i:04d}", "user_id": "alice", "content": f"fact {i}", "text": f"fact {i}",
         "vector": rng.standard_normal(384).astype("float32").tolist(), "source_ids": [f"m{i}"]}
        for i in range(500)]
for t in range(trials):
    store = Store(f"{root}/trial-{t}", dim=384, lease_backend=backend)
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        store.upsert("fragments", rows)
    except Exception as exc:  # without the lease LanceDB may also refuse one of the two commits
        if lease:
            raise
        print(f"conflict {type(exc).__name__}", file=sys.stderr, flush=True)
    print("done", flush=True)
"""

#: holds a lease of the store at argv[1] (argv[2]: "write" or "run") for argv[3] seconds, with lease
#: backend argv[4] and row lease lifetime argv[5]; says "held", sleeps
HOLDER = """
import sys, time
from memory.lease import run_lease, write_lease
hold = write_lease if sys.argv[2] == "write" else run_lease
with hold(sys.argv[1], 5.0, sys.argv[4], float(sys.argv[5])):
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
"""


def _python(code: str, *args: str, **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, text=True, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, **kw)


def _expect(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdout is not None
    got = proc.stdout.readline().strip()
    assert got == line, f"expected {line!r} from the child, got {got!r} (exit {proc.poll()})"


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Any]:
    """`holder(uri, kind)`: a process holding a lease of the store at `uri` (killed at the end)."""
    procs: list[subprocess.Popen[str]] = []

    def start(uri: str, kind: str, seconds: float = 120, backend: str = "auto",
              ttl_s: float = 30.0) -> subprocess.Popen[str]:
        proc = _python(HOLDER, uri, kind, str(seconds), backend, str(ttl_s))
        procs.append(proc)
        _expect(proc, "held")
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def race(root: Path, trials: int, *, lease_on: bool, backend: str = "auto") -> list[int]:
    """Two processes upsert the same 500 new ids into a fresh store at the same instant, `trials`
    times (lease backend `backend`); the number of duplicate rows of each trial."""
    procs = [_python(RACER, str(root), str(trials), "1" if lease_on else "0", backend) for _ in range(2)]
    try:
        for _ in range(trials):
            for p in procs:
                _expect(p, "ready")
            for p in procs:  # both are blocked on stdin: they start within microseconds of each other
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            for p in procs:
                _expect(p, "done")
    finally:
        for p in procs:
            p.wait(timeout=60)
    assert [p.returncode for p in procs] == [0, 0]
    dups = []
    for t in range(trials):
        store = Store(str(root / f"trial-{t}"), dim=384)
        ids = store.read("fragments", columns=["id"]).column("id").to_pylist()
        assert set(ids) == {f"frag-{i:04d}" for i in range(500)}
        dups.append(len(ids) - len(set(ids)))
    return dups


def test_two_processes_upserting_the_same_new_ids_leave_no_duplicate(tmp_path: Path) -> None:
    dups = race(tmp_path, 20, lease_on=True)
    assert dups == [0] * 20
    for t in range(20):
        assert check(Store(str(tmp_path / f"trial-{t}"), dim=384)).duplicates == {}


def test_without_the_lease_doctor_repairs_what_the_race_left(tmp_path: Path) -> None:
    """The same race without the lease: LanceDB lets both `merge_insert`s through (lancedb#2463) and
    duplicates the ids in most trials (19 of 20 when measured), or refuses one commit; whatever it
    left, doctor --fix removes exactly the duplicate rows and keeps one row per id."""
    dups = race(tmp_path, 4, lease_on=False)
    for t in range(4):
        store = Store(str(tmp_path / f"trial-{t}"), dim=384)
        found = duplicate_ids(store).get("fragments", {})
        assert sum(found.values()) - len(found) == dups[t]       # doctor sees every extra copy
        report = check(store, fix=True)
        assert report.removed.get("fragments", 0) == dups[t]
        assert duplicate_ids(store) == {}
        assert store.read("fragments", columns=["id"]).num_rows == 500


def test_a_killed_writer_never_leaves_the_store_locked(tmp_path: Path, holder: Any) -> None:
    uri = str(tmp_path / "store")
    store = Store(uri, dim=384, write_lease_wait_s=0.3)
    proc = holder(uri, "write")
    with pytest.raises(StoreBusyError, match=f"pid {proc.pid}"):
        store.upsert("runs", [{"id": "r1", "kind": "test"}])
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    start = time.perf_counter()
    Store(uri, dim=384, write_lease_wait_s=2.0).upsert("runs", [{"id": "r1", "kind": "test"}])
    taken = time.perf_counter() - start
    print(f"\nwrite lease taken {taken * 1000:.1f} ms after its holder was killed")
    assert taken < 2.0
    assert store.read("runs", columns=["id"]).column("id").to_pylist() == ["r1"]
    assert check(store).ok


def test_a_killed_run_never_leaves_the_run_lease_held(tmp_path: Path, holder: Any) -> None:
    uri = str(tmp_path / "store")
    proc = holder(uri, "run")
    with pytest.raises(RunInProgressError, match="still in progress"):
        with run_lease(uri, 0.2):
            pass
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    with run_lease(uri, 2.0):
        assert lease(uri, "run").held()
    assert not lease(uri, "run").held()


def test_a_waiting_writer_goes_in_when_the_holder_lets_go(tmp_path: Path, holder: Any) -> None:
    """Writes wait for the lease (they are not refused) and are not lost."""
    uri = str(tmp_path / "store")
    holder(uri, "write", 1.0)
    start = time.perf_counter()
    Store(uri, dim=384, write_lease_wait_s=30).upsert("runs", [{"id": "late", "kind": "test"}])
    assert 0.3 < time.perf_counter() - start < 30
    assert Store(uri, dim=384).read("runs", columns=["id"]).num_rows == 1


def test_writes_go_through_while_a_run_holds_the_run_lease(tmp_path: Path, holder: Any) -> None:
    uri = str(tmp_path / "store")
    holder(uri, "run")
    store = Store(uri, dim=384, write_lease_wait_s=1.0)
    store.upsert("feedback", [{"id": "fb1", "user_id": "alice"}])
    assert store.read("feedback", columns=["id"]).num_rows == 1
    assert check(store).ok


def test_appends_during_a_consolidation_go_in_between_its_commits(tmp_path: Path) -> None:
    """A consolidation runs in another process while this one appends feedback rows and a second
    user's messages: every write is accepted (it waits at most for one commit), none is lost, and
    no id is duplicated."""
    from memory.ingest import ingest
    from tests.helpers import SAMPLE

    uri = str(tmp_path / "store")
    ingest(Store(uri, dim=384), SAMPLE, "jsonl")
    code = ("import sys; from memory.runs import consolidate, open_store; from memory.settings import Settings; "
            "s = Settings(store=sys.argv[1]); print(consolidate(open_store(s), s).status, flush=True)")
    run = _python(code, uri)
    store = Store(uri, dim=384, write_lease_wait_s=30)
    waits, i = [], 0
    while run.poll() is None or i < 5:
        start = time.perf_counter()
        store.upsert("feedback", [{"id": f"fb-{i}", "user_id": "alice"}])
        store.upsert("messages", [{"id": f"late-{i}", "user_id": "carol", "session_id": "s1",
                                   "message_id": f"carol-s1-m{i:03d}", "seq": i, "text": f"note {i}"}])
        waits.append(time.perf_counter() - start)
        i += 1
        time.sleep(0.02)
    assert run.wait(timeout=120) == 0
    assert run.stdout is not None and run.stdout.read().split() == ["completed"]
    waits.sort()
    print(f"\n{len(waits)} append pairs during the run: median {waits[len(waits) // 2] * 1000:.1f} ms, "
          f"max {waits[-1] * 1000:.1f} ms")
    assert store.read("feedback", columns=["id"]).num_rows == i
    assert store.read("messages", "carol", columns=["id"]).num_rows == i
    assert duplicate_ids(store) == {}
    runs = store.read("runs", columns=["kind", "status"]).to_pylist()
    assert [r["status"] for r in runs if r["kind"] == "consolidate"] == ["completed"]


def test_the_lease_is_reentrant_in_a_thread_and_exclusive_between_threads(tmp_path: Path) -> None:
    uri = str(tmp_path / "store")
    store = Store(uri, dim=384, write_lease_wait_s=0.2)
    seen: list[str] = []
    with store.write_lease():
        store.upsert("runs", [{"id": "a", "kind": "test"}])   # re-entered by the holding thread

        def other() -> None:
            try:
                store.upsert("runs", [{"id": "b", "kind": "test"}])
            except StoreBusyError:
                seen.append("busy")

        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert seen == ["busy"]
    store.upsert("runs", [{"id": "b", "kind": "test"}])
    assert sorted(store.read("runs", columns=["id"]).column("id").to_pylist()) == ["a", "b"]
    assert lock_path(uri, "write") == Path(uri) / ".mnemo-write.lock"
    assert lock_path("s3://bucket/store", "write") != lock_path("s3://bucket/other", "write")
    assert lock_path("memory://x", "run") is None


@pytest.mark.parametrize("engine", ["local", "prefect"])
def test_a_second_consolidation_while_a_run_holds_the_lease_exits_75(tmp_path: Path, holder: Any,
                                                                    engine: str) -> None:
    uri = str(tmp_path / "store")
    Store(uri).table("runs")   # a store: a folder holding a mnemo table (an empty one is refused, exit 2)
    proc = holder(uri, "run")
    res = CliRunner().invoke(app, ["--store", uri, "consolidate", "--engine", engine])
    assert res.exit_code == 75, res.output
    assert "skipped: a consolidation run is still in progress" in res.output
    assert f"pid {proc.pid}" in res.output
    assert "Traceback" not in res.output


def test_a_run_waits_for_the_lease_and_takes_over_from_a_killed_run(tmp_path: Path, holder: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    uri = str(tmp_path / "store")
    Store(uri).table("runs")
    proc = holder(uri, "run")
    threading.Timer(0.5, os.kill, (proc.pid, signal.SIGKILL)).start()
    monkeypatch.setenv("MNEMO_RUN_LEASE_WAIT_S", "20")
    start = time.perf_counter()
    res = CliRunner().invoke(app, ["--store", uri, "consolidate", "--engine", "local"])
    assert res.exit_code == 0, res.output
    assert 0.4 < time.perf_counter() - start < 20
    assert check(Store(uri, dim=384)).ok


def test_lease_overhead_per_upsert(tmp_path: Path) -> None:
    """Prints what the writer lease adds to an upsert (no timing is asserted)."""
    rows = [{"id": f"r{i}", "kind": "test"} for i in range(20)]
    timings: dict[str, float] = {}
    for mode in ("without", "with"):
        store = Store(str(tmp_path / mode), dim=384)
        if mode == "without":
            setattr(store, "write_lease", lambda: nullcontext())   # the same store, no lease
        store.upsert("runs", rows)
        start = time.perf_counter()
        for i in range(40):
            store.upsert("runs", [{"id": f"r{i % 20}", "kind": f"k{i}"}])
        timings[mode] = (time.perf_counter() - start) / 40
    n = 2000
    start = time.perf_counter()
    for _ in range(n):
        with write_lease(str(tmp_path / "with")):
            pass
    bare = (time.perf_counter() - start) / n
    print(f"\nupsert of one row: {timings['without'] * 1000:.2f} ms without the lease, "
          f"{timings['with'] * 1000:.2f} ms with it; taking and releasing an uncontended lease: "
          f"{bare * 1e6:.0f} us")
    assert duplicate_ids(Store(str(tmp_path / "with"), dim=384)) == {}


@pytest.mark.slow
def test_a_killed_runs_prefect_server_is_stopped_by_the_next_run(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    from flows.ephemeral import alive, reap_orphans

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               TMPDIR=str(tmp_path))
    code = ("import time; from flows.ephemeral import start_recorded; "
            "print(start_recorded(), flush=True); time.sleep(120)")
    proc = _python(code, env=env, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        server = int(proc.stdout.readline().strip())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert alive(server)   # re-parented: Prefect's atexit hook never ran
        # ... and it holds none of its run's output: the caller's pipe ends (`mnemo consolidate | tee`)
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        assert ready and proc.stdout.read() == ""
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))   # where the child recorded it
        assert reap_orphans() == [server]
        assert not alive(server)
        assert reap_orphans() == []
    finally:
        if proc.poll() is None:
            proc.kill()


def test_old_store_gains_new_columns(tmp_path):
    """A table written before a column was added to its schema is evolved on open (nulls), so
    upserts of the new schema work on old stores."""
    import lancedb
    import pyarrow as pa

    from memory import schemas
    from memory.store import Store

    full = schemas.schema_for("sessions", 384)
    old = pa.schema([f for f in full if f.name != "observed"])
    db = lancedb.connect(str(tmp_path))
    db.create_table("sessions", data=pa.Table.from_pylist(
        [{"id": "s1", "user_id": "u", "session_id": "s1", "n_messages": 2}], schema=old))
    store = Store(str(tmp_path))
    store.upsert("sessions", [{"id": "s2", "user_id": "u", "session_id": "s2", "n_messages": 1, "observed": True}])
    rows = {r["id"]: r for r in store.read("sessions").to_pylist()}
    assert rows["s1"]["observed"] is None and rows["s2"]["observed"] is True
