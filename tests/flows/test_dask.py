"""The consolidate flow on a real local Dask cluster (2 worker processes, through prefect-dask)
builds exactly the memory the default thread runner builds on an identical store."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from flows.consolidate import run_flow, task_runner_for
from memory.ingest import ingest
from memory.runs import open_store
from memory.settings import Settings
from memory.store import Store
from tests.helpers import SAMPLE, memory_snapshot

pytestmark = pytest.mark.slow

def test_task_runner_choice() -> None:
    from prefect.task_runners import ThreadPoolTaskRunner
    from prefect_dask import DaskTaskRunner

    assert isinstance(task_runner_for(Settings()), ThreadPoolTaskRunner)
    local = task_runner_for(Settings(dask_local=2))
    assert isinstance(local, DaskTaskRunner) and local.cluster_kwargs["n_workers"] == 2
    remote = task_runner_for(Settings(dask_address="tcp://10.0.0.1:8786", dask_local=2))
    assert isinstance(remote, DaskTaskRunner) and remote.address == "tcp://10.0.0.1:8786"


def test_dask_cluster_equals_threads(prefect_harness: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings reach the workers as data: the workers inherit an environment asking for θ = 0.99 (no
    links at all), the flow is handed θ = 0.6, and both runners link with 0.6."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the worker processes inherit it
    monkeypatch.setenv("MNEMO_THETA", "0.99")
    results: dict[str, dict[str, Any]] = {}
    stores: dict[str, Store] = {}
    for kind, extra in (("threads", {}), ("dask", {"dask_local": 2})):
        root = tmp_path / kind
        # one user per shard, so the stages of different shards run side by side on the workers
        settings = Settings(store=str(root), shard_size=1, theta=0.6, **extra)
        stores[kind] = open_store(settings)
        assert ingest(stores[kind], SAMPLE, "jsonl").users
        results[kind] = run_flow("consolidate", settings, users=None)

    threads, dask = memory_snapshot(stores["threads"]), memory_snapshot(stores["dask"])
    assert dask == threads
    users = dask["stats"]["users"]
    assert users and all(row["fragments"] > 0 for row in users.values())
    assert sum(row["links"] for row in users.values()) > 0, "θ came from the environment, not the flow"
    assert results["dask"]["counts"] == results["threads"]["counts"]
    for kind, store in stores.items():
        runs = [r for r in store.read("runs").to_pylist() if r["kind"] != "ingest"]
        assert [r["kind"] for r in runs] == ["consolidate"], kind
