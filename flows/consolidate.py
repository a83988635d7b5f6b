"""Prefect flows: `consolidate` (nightly, incremental by watermark) and `backfill` (a whole archive).

Users are mapped in shards; each stage of a shard is one task (load, extract, embed, link,
reason, embed-insights), so a transient failure retries only its stage and the LLM response
cache means a retried stage never pays twice. The flow itself is the one writer: it commits each
finished shard (tables, then watermarks) as it completes.
"""
from __future__ import annotations

import logging
import time
from functools import lru_cache
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import as_completed
from prefect.task_runners import ThreadPoolTaskRunner

from memory import pipeline
from memory.errors import LLMTransientError
from memory.pipeline import ShardState
from memory.runs import new_report, open_store, plan_shards
from memory.settings import Settings, get_settings
from memory.store import Store

log = logging.getLogger(__name__)


def _settings(overrides: dict[str, Any] | None) -> Settings:
    return get_settings().with_overrides(**(overrides or {}))


@lru_cache(maxsize=4)
def _store(uri: str, dim: int) -> Store:
    return Store(uri, dim=dim)


def _open(settings: Settings) -> Store:
    return _store(settings.store, pipeline.embedder_for(settings).dim)


def _transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a stage only for failures worth retrying (timeouts, 429, 5xx), never for bad input."""
    try:
        state.result()
    except LLMTransientError:
        return True
    except Exception:
        return False
    return False


_stage = dict(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=_transient)


@task(name="load", cache_policy=NO_CACHE)
def load_task(users: list[str], overrides: dict[str, Any], run_id: str) -> ShardState:
    return pipeline.load_shard(_open(_settings(overrides)), users, run_id)


@task(name="extract", **_stage)
def extract_task(state: ShardState, overrides: dict[str, Any]) -> ShardState:
    s = _settings(overrides)
    return pipeline.extract(state, _open(s), s) if state.sessions else state


@task(name="embed", cache_policy=NO_CACHE)
def embed_task(state: ShardState, overrides: dict[str, Any]) -> ShardState:
    return pipeline.embed(state, _settings(overrides)) if state.sessions else state


@task(name="link", cache_policy=NO_CACHE)
def link_task(state: ShardState, overrides: dict[str, Any]) -> ShardState:
    return pipeline.link(state, _settings(overrides)) if state.sessions else state


@task(name="reason", **_stage)
def reason_task(state: ShardState, overrides: dict[str, Any]) -> ShardState:
    s = _settings(overrides)
    return pipeline.reason(state, _open(s), s) if state.sessions else state


@task(name="embed-insights", cache_policy=NO_CACHE)
def embed_insights_task(state: ShardState, overrides: dict[str, Any]) -> ShardState:
    s = _settings(overrides)
    return pipeline.embed_insights(state, _open(s), s) if state.sessions else state


def task_runner_for(settings: Settings) -> Any:
    """Local bounded threads by default; Dask through prefect-dask when asked."""
    if settings.dask_address:
        from prefect_dask import DaskTaskRunner

        return DaskTaskRunner(address=settings.dask_address)
    if settings.dask_local or settings.task_runner == "dask":
        from prefect_dask import DaskTaskRunner

        n = settings.dask_local or settings.max_workers
        return DaskTaskRunner(cluster_kwargs={"n_workers": n, "processes": True, "threads_per_worker": 1,
                                              "dashboard_address": None})
    return ThreadPoolTaskRunner(max_workers=max(1, settings.max_workers))


def _run(kind: str, users: list[str] | None, overrides: dict[str, Any]) -> dict[str, Any]:
    logger = get_run_logger()
    start = time.perf_counter()
    settings = _settings(overrides)
    store = open_store(settings)
    report = new_report(kind, settings)
    shards = plan_shards(store, users, settings.shard_size)
    logger.info("%s %s: %d shards of up to %d users", kind, report.run_id, len(shards), settings.shard_size)
    futures = []
    for shard in shards:
        s = load_task.submit(shard, overrides, report.run_id)
        s = extract_task.submit(s, overrides)
        s = embed_task.submit(s, overrides)
        s = link_task.submit(s, overrides)
        s = reason_task.submit(s, overrides)
        futures.append(embed_insights_task.submit(s, overrides))
    done = 0
    for fut in as_completed(futures):
        state = fut.result()
        if state.sessions:
            pipeline.commit(store, state)  # the flow is the one writer of the run
        report.add(state)
        done += 1
        logger.info("shard %d/%d committed: %s", done, len(shards), state.counts())
    report.seconds = time.perf_counter() - start
    store.upsert("runs", [report.runs_row()])
    logger.info(report.summary())
    return {"run_id": report.run_id, "summary": report.summary(), "counts": report.counts, "llm": report.llm}


@flow(name="consolidate", task_runner=ThreadPoolTaskRunner(max_workers=2))
def consolidate_flow(users: list[str] | None = None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Nightly: consolidate every user's sessions newer than its watermark."""
    return _run("consolidate", users, overrides or {})


@flow(name="backfill", task_runner=ThreadPoolTaskRunner(max_workers=2))
def backfill_flow(path: str, fmt: str, overrides: dict[str, Any] | None = None,
                  observations_as_fragments: bool = False) -> dict[str, Any]:
    """A whole archive: ingest it, then consolidate its users shard by shard. Resumable: a re-run
    skips what was committed (watermarks) and re-pays no LLM call (response cache)."""
    from memory.ingest import ingest

    settings = _settings(overrides)
    report = ingest(open_store(settings), path, fmt, observations_as_fragments=observations_as_fragments)
    get_run_logger().info(report.summary())
    result = _run("backfill", report.users or None, overrides or {})
    result["ingest"] = report.summary()
    return result


def run_flow(name: str, settings: Settings, **params: Any) -> dict[str, Any]:
    """Run a flow with the task runner these settings ask for."""
    fl = {"consolidate": consolidate_flow, "backfill": backfill_flow}[name]
    return fl.with_options(task_runner=task_runner_for(settings))(**params)
