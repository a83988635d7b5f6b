"""End to end through a real Prefect server: the deployments of infra/prefect.yaml are registered,
a run of `consolidate/nightly` is triggered with CLI parameters, and a process worker picks it up
and consolidates a store ingested beforehand.

Every subprocess (server, worker, CLI calls) runs in its own process group with a bounded wait
and is killed in teardown; the server uses a SQLite database and a PREFECT_HOME in tmp_path, no
UI, no analytics, no scheduler.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from memory.ingest import ingest
from memory.read import stats
from memory.runs import open_store
from memory.settings import Settings
from tests.helpers import REPO, SAMPLE

pytestmark = pytest.mark.slow

PREFECT = str(Path(sys.executable).with_name("prefect"))
POOL = "mnemo"  # the work pool named in infra/prefect.yaml
RUN_TIMEOUT_S = 240
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _stop(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
    """Terminate a process group we started, then kill it if it lingers."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


class PrefectServer:
    """A `prefect server start` subprocess plus the environment that talks to it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[Any]] = []
        home = tmp / "prefect-home"
        home.mkdir(parents=True, exist_ok=True)
        db = f"sqlite+aiosqlite:///{tmp / 'prefect.db'}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update({
            "PREFECT_HOME": str(home),
            "PREFECT_PROFILES_PATH": str(home / "profiles.toml"),
            "PREFECT_API_DATABASE_CONNECTION_URL": db,
            "PREFECT_SERVER_DATABASE_CONNECTION_URL": db,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_SERVER_UI_ENABLED": "false",
            "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false",
            "PREFECT_SERVER_SERVICES_LATE_RUNS_ENABLED": "false",
            "PREFECT_SERVER_SERVICES_FOREMAN_ENABLED": "false",
            "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
            "PREFECT_CLI_WRAP_LINES": "false",
            "PREFECT_LOGGING_LEVEL": "INFO",
            "COLUMNS": "200",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "MNEMO_REPO_DIR": str(REPO),
        })
        self.env = env
        self.url = ""

    # -- processes ------------------------------------------------------------------------
    def spawn(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[Any]:
        with open(log, "wb") as out:
            proc = subprocess.Popen(args, cwd=REPO, env=env or self.env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(proc)
        return proc

    def start(self, timeout_s: float = 60.0, attempts: int = 3) -> None:
        for attempt in range(attempts):
            port = _free_port()
            log = self.tmp / f"server-{attempt}.log"
            proc = self.spawn([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port),
                               "--no-ui", "--analytics-off", "--no-scheduler", "--no-late-runs"], log)
            url = f"http://127.0.0.1:{port}/api"
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and proc.poll() is None:
                if _healthy(url):
                    # still ours a moment later (a server that lost the port race exits quickly)
                    time.sleep(1.0)
                    if proc.poll() is None and _healthy(url):
                        self.url = url
                        self.env["PREFECT_API_URL"] = url
                        return
                time.sleep(0.5)
            _stop(proc)  # port taken meanwhile, or too slow: try another port
            last_log = log.read_text(errors="replace")[-3000:]
        raise AssertionError(f"prefect server did not become healthy:\n{last_log}")

    def cli(self, *args: str, timeout_s: float = 120.0, env: dict[str, str] | None = None) -> str:
        """Run `prefect ARGS...` to completion (bounded) and return its output; fail on a non-zero exit."""
        proc = subprocess.Popen([PREFECT, *args], cwd=REPO, env=env or self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                text=True)
        self.procs.append(proc)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc)
            out, _ = proc.communicate()
            raise AssertionError(f"`prefect {' '.join(args)}` timed out after {timeout_s}s:\n{out[-3000:]}")
        assert proc.returncode == 0, f"`prefect {' '.join(args)}` exited {proc.returncode}:\n{out[-3000:]}"
        return out

    def stop(self) -> None:
        for proc in reversed(self.procs):
            _stop(proc)

    # -- API ------------------------------------------------------------------------------
    def api(self, method: str, path: str, **kw: Any) -> Any:
        resp = httpx.request(method, f"{self.url}{path}", timeout=10.0, **kw)
        resp.raise_for_status()
        return resp.json()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PrefectServer]:
    srv = PrefectServer(tmp_path)
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()


def _wait_final(srv: PrefectServer, flow_run_id: str, worker: subprocess.Popen[Any], worker_log: Path,
                deadline: float) -> dict[str, Any]:
    run: dict[str, Any] = {}
    while time.monotonic() < deadline:
        run = srv.api("GET", f"/flow_runs/{flow_run_id}")
        if (run.get("state") or {}).get("type") in FINAL:
            return run
        if worker.poll() is not None and (run.get("state") or {}).get("type") == "SCHEDULED":
            break  # the worker left without picking the run up
        time.sleep(1.0)
    raise AssertionError(f"flow run {flow_run_id} not final in time (state {run.get('state')}); "
                         f"worker log:\n{worker_log.read_text(errors='replace')[-4000:]}")


def _trigger(srv: PrefectServer, deployment: str, **params: Any) -> str:
    """`prefect deployment run NAME --param k=v ...`; returns the new flow run's id."""
    args = ["deployment", "run", deployment]
    for key, value in params.items():
        args += ["--param", f"{key}={json.dumps(value)}"]
    out = srv.cli(*args)
    match = re.search(r"UUID:\s*([0-9a-f-]{36})", out)
    assert match, out
    return match.group(1)


def _ingested(root: Path) -> None:
    assert ingest(open_store(Settings(store=str(root))), SAMPLE, "jsonl").users


def _check_consolidated(root: Path) -> None:
    store = open_store(Settings(store=str(root)))
    users = stats(store)["users"]
    assert users and all(row["fragments"] > 0 for row in users.values()), users
    assert sum(row["insights"] for row in users.values()) > 0
    runs = [r for r in store.read("runs").to_pylist() if r["kind"] != "ingest"]
    assert len(runs) == 1 and runs[0]["kind"] == "consolidate" and runs[0]["status"] == "completed", runs
    assert store.read("watermarks").num_rows == len(store.users())


def test_deployment_runs_on_a_process_worker(server: PrefectServer, tmp_path: Path) -> None:
    """Two runs of `consolidate/nightly`: one with an `overrides` store, one as the schedule starts it
    (no parameters: the store comes from the worker's MNEMO_STORE)."""
    param_store, worker_store = tmp_path / "param-store", tmp_path / "worker-store"
    _ingested(param_store)
    _ingested(worker_store)

    server.cli("work-pool", "create", POOL, "--type", "process")
    out = server.cli("--no-prompt", "deploy", "--all", "--prefect-file", "infra/prefect.yaml")
    names = {d["name"] for d in server.api("POST", "/deployments/filter", json={})}
    assert {"nightly", "backfill"} <= names, out[-2000:]
    dep = server.api("GET", "/deployments/name/consolidate/nightly")
    assert dep["work_pool_name"] == POOL and dep["entrypoint"] == "flows/consolidate.py:consolidate_flow"
    assert [s["schedule"]["cron"] for s in dep["schedules"]] == ["30 2 * * *"]

    with_param = _trigger(server, "consolidate/nightly", overrides={"store": str(param_store)})
    as_scheduled = _trigger(server, "consolidate/nightly")

    worker_env = dict(server.env, MNEMO_STORE=str(worker_store), MNEMO_LLM="rules")
    worker_log = tmp_path / "worker.log"
    worker = server.spawn([PREFECT, "worker", "start", "--pool", POOL, "--type", "process", "--run-once",
                           "--install-policy", "never", "--name", "mnemo-test-worker"],
                          worker_log, env=worker_env)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    for flow_run_id, overrides in ((with_param, {"store": str(param_store)}), (as_scheduled, {})):
        run = _wait_final(server, flow_run_id, worker, worker_log, deadline)
        assert run["state"]["type"] == "COMPLETED", (
            f"{run['state']}\nworker log:\n{worker_log.read_text(errors='replace')[-6000:]}")
        assert run["parameters"]["overrides"] == overrides
        assert run["deployment_id"] == dep["id"]

    _check_consolidated(param_store)
    _check_consolidated(worker_store)
