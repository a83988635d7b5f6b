"""Prefect flows: `consolidate` (nightly, incremental by watermark) and `backfill` (a whole archive).

Users are mapped in shards; each stage of a shard is one task (`load`, then every stage of
`memory.stages.STAGES`), so a transient failure retries only its stage and the LLM response
cache means a retried stage never pays twice. The settings are resolved once, in the flow, and
reach every task (threads or Dask workers) as data. The flow itself is the one writer: it commits each
finished shard (tables, then watermarks) as it completes, each shard's commit under one hold of the
store's writer lease (other processes' appends and feedback go in between two commits).

A run holds the store's run lease (`memory.lease`) from start to end: a second run waits up to
`Settings.run_lease_wait_s`, then raises `RunInProgressError` (the CLI exits 75). `run_flow` takes it
before Prefect starts anything, and stops the temporary Prefect servers that killed runs left
(`flows.ephemeral`); the flows take it too, for deployments that call them directly.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture, as_completed
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from flows.ephemeral import reap_orphans, start_recorded
from memory.embed import check_embedder, embedder_for
from memory.errors import ConfigError, LLMTransientError
from memory.ingest import ingest
from memory.lease import is_local, run_lease
from memory.pipeline import has_work
from memory.runs import compact, compacted_tables, finish_forgets, new_report, open_store, plan_shards
from memory.settings import Settings, load_settings
from memory.stages import STAGES, stage
from memory.stages.commit import commit
from memory.stages.load import load_shard
from memory.stages.shard import ShardState, StageContext
from memory.store import Store
from retrieval.rerank import train_step
from retrieval.retriever import Retriever

log = logging.getLogger(__name__)


def resolve_settings(settings: Settings | None, overrides: dict[str, Any] | None) -> Settings:
    """The flow's settings: the caller's object (the CLI passes its own), else the environment of the
    process running the flow (a deployment), with a deployment's `overrides` on top. Read once, here:
    tasks get the result as data, so Dask workers never read their own environment."""
    return absolute_store((settings or load_settings()).with_overrides(**(overrides or {})))


def absolute_store(settings: Settings) -> Settings:
    """The settings with a store given as a relative local path made absolute, against this process's
    folder: a Dask worker would open (and make) another store under its own folder (URIs as given)."""
    if "://" in settings.store or os.path.isabs(settings.store):
        return settings
    return settings.with_overrides(store=os.path.abspath(settings.store))


@lru_cache(maxsize=4)
def _store(uri: str, dim: int, write_lease_wait_s: float, lease_backend: str, lease_ttl_s: float) -> Store:
    return Store(uri, dim=dim, write_lease_wait_s=write_lease_wait_s, lease_backend=lease_backend,
                 lease_ttl_s=lease_ttl_s)


def _open(settings: Settings) -> Store:
    """One store handle per process (and Dask worker) and URI."""
    return _store(settings.store, embedder_for(settings).dim, settings.write_lease_wait_s, settings.lease_backend,
                  settings.lease_ttl_s)


def _transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a stage only for failures worth retrying (the backend gave up on timeouts, 429, 5xx),
    never for bad input. The backend retries each request; this retries the stage as a whole."""
    try:
        state.result()
    except LLMTransientError:
        return True
    except Exception:
        return False
    return False


#: waits before the retries of an LLM stage (tests set them to zero)
RETRY_DELAYS_S = [5, 30]


@task(name="load", cache_policy=NO_CACHE)
def load_task(users: list[str], settings: Settings, run_id: str) -> ShardState:
    return load_shard(existing(settings), users, run_id, settings)


def existing(settings: Settings) -> Store:
    """`_open`, refusing a store without a `messages` table (a path this worker sees otherwise than the
    process that planned the run): opening it would make an empty store, load nothing and commit nothing."""
    uri = settings.store
    where = f"on host {socket.gethostname()}, folder {os.getcwd()}"
    if is_local(uri) and not (Path(uri.removeprefix("file://")) / "messages.lance").is_dir():
        raise ConfigError(f"no store with messages at {uri} {where}: give --store / MNEMO_STORE as an absolute "
                          "path (or a URI) that every Dask worker reaches", store=uri)
    store = _open(settings)
    if not store.has_table("messages"):
        raise ConfigError(f"the store at {uri} has no messages table {where}: check --store / MNEMO_STORE",
                          store=uri)
    return store


@task(name="stage", cache_policy=NO_CACHE)
def stage_task(name: str, state: ShardState, settings: Settings) -> ShardState:
    """One consolidation stage of one shard (see `memory.stages.STAGES`)."""
    if not has_work(state, settings):
        return state
    return stage(name).run(state, StageContext.create(_open(settings), settings, state.run_id))


def _stage_tasks() -> list[Any]:
    """One Prefect task per stage; LLM stages retry on transient errors only."""
    out = []
    for spec in STAGES:
        opts: dict[str, Any] = {"name": spec.name, "task_run_name": spec.name}
        if spec.retryable:
            opts.update(retries=len(RETRY_DELAYS_S), retry_delay_seconds=list(RETRY_DELAYS_S),
                        retry_condition_fn=_transient)
        out.append((spec.name, stage_task.with_options(**opts)))
    return out


def _threads(n: int) -> TaskRunner[PrefectFuture[Any]]:
    """A bounded thread pool (Prefect types `task_runner` invariantly in its future type, hence the cast)."""
    return cast("TaskRunner[PrefectFuture[Any]]", ThreadPoolTaskRunner(max_workers=max(1, n)))


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
    return _threads(settings.max_workers)


def check_scheduler(address: str, timeout_s: float | None = None) -> None:
    """Connect once to the Dask scheduler at `address` (within `timeout_s`, default Dask's
    `distributed.comm.timeouts.connect`, 30 s) before Prefect starts: one the runner cannot reach is a
    `ConfigError` naming it, not a flow that fails inside Prefect with a long traceback."""
    import asyncio

    from distributed.comm import connect
    from distributed.security import Security

    async def probe() -> None:   # with the TLS settings of Dask's config, as the runner's Client connects
        comm = await connect(address, timeout=timeout_s, **Security().get_connection_args("client"))
        await comm.close()

    try:
        asyncio.run(probe())
    except (OSError, TimeoutError, ValueError, TypeError) as exc:   # refused, timed out, a scheme Dask does not
        # know, tls:// without Dask's TLS settings (the runner's Client would fail alike, inside the flow)
        raise ConfigError(f"cannot reach the Dask scheduler at {address}: {exc}; check --dask-address / "
                          "MNEMO_DASK_ADDRESS", address=address) from None


def _shard_result(chain: list[Any]) -> ShardState:
    """The shard's final state, or the error of the stage that failed.

    When a stage fails, the stages after it end `NotReady` and the last one's `result()` only says
    "Run is in PENDING state": raise the failed stage's own exception instead.
    """
    final = chain[-1]
    final.wait()
    if not final.state.is_completed():
        for fut in chain:
            fut.wait()
            if fut.state.is_failed() or fut.state.is_crashed():
                fut.result()  # raises the stage's exception
    return final.result()


def _run(kind: str, users: list[str] | None, settings: Settings) -> dict[str, Any]:
    logger = get_run_logger()
    start = time.perf_counter()
    store = open_store(settings)
    report = new_report(kind, settings)
    check_embedder(store, embedder_for(settings))
    for line in finish_forgets(store, settings, users):   # under the run lease, before the shards are planned
        logger.warning("%s", line)
    shards = plan_shards(store, users, settings.shard_size, everyone=settings.rebuild_graph)
    logger.info("%s %s: %d shards of up to %d users", kind, report.run_id, len(shards), settings.shard_size)
    chains: dict[Any, tuple[list[str], list[Any]]] = {}
    stage_tasks = _stage_tasks()
    for shard in shards:
        chain = [load_task.submit(shard, settings, report.run_id)]
        for name, task_ in stage_tasks:
            chain.append(task_.submit(name, chain[-1], settings))
        chains[chain[-1].task_run_id] = (shard, chain)
    done = 0
    failed: list[tuple[list[str], Exception]] = []
    for fut in as_completed([chain[-1] for _, chain in chains.values()]):
        shard, chain = chains[fut.task_run_id]
        try:
            state = _shard_result(chain)
        except Exception as exc:
            # keep committing the other shards (their work is done); this one is redone next run
            failed.append((shard, exc))
            logger.error("shard of users %s failed: %s: %s", shard, type(exc).__name__, exc)
            continue
        if has_work(state, settings):
            with store.write_lease():  # the flow is the one writer of the run; one unit per shard
                commit(store, state)
        report.add(state)
        done += 1
        logger.info("shard %d/%d committed: %s", done, len(shards), state.counts())
    report.seconds = time.perf_counter() - start
    if failed:
        report.status = "failed"
    store.upsert("runs", [report.runs_row()])
    report.compaction = compact(store, settings, compacted_tables(report), always=kind == "backfill")
    logger.info(report.summary())
    logger.info(report.compaction)
    if failed:
        logger.error("%d of %d shards failed; their users keep their watermarks and are redone next run",
                     len(failed), len(shards))
        raise failed[0][1]
    return {"run_id": report.run_id, "status": report.status, "summary": report.summary(),
            "counts": report.counts, "outcome": report.outcome, "llm": report.llm,
            "compaction": report.compaction}


@task(name="train", task_run_name="train", cache_policy=NO_CACHE)
def train_task(settings: Settings, run_id: str, users: list[str] | None = None) -> list[str]:
    """RMM retrospective reflection: the next reranker version from the feedback newer than the last
    one (`retrieval.rerank.train_step`); skipped when there is none. `users` (`--users`): only their
    versions."""
    store = _open(settings)
    if not store.has_table("feedback"):
        return ["reranker: skipped (no feedback)"]
    r = Retriever(store, settings, embedder_for(settings))
    return train_step(r, scope=settings.retrieval.rerank_scope, run_id=run_id, users=users)


@flow(name="consolidate", task_runner=_threads(2))
def consolidate_flow(users: list[str] | None = None, overrides: dict[str, Any] | None = None,
                     settings: Settings | None = None) -> dict[str, Any]:
    """Nightly: consolidate every user's sessions newer than its watermark, then train the reranker
    from new feedback (after every shard committed). `settings` defaults to the environment of the
    process running the flow; a deployment's `overrides` apply on top."""
    resolved = resolve_settings(settings, overrides)
    with run_lease(resolved.store, resolved.run_lease_wait_s, resolved.lease_backend, resolved.lease_ttl_s):
        return _consolidate(users, resolved)


def _consolidate(users: list[str] | None, resolved: Settings) -> dict[str, Any]:
    result = _run("consolidate", users, resolved)
    try:
        result["train"] = train_task(resolved, result["run_id"], users)
    except Exception as exc:  # consolidation is committed; a failed training waits for the next run
        get_run_logger().error("reranker training failed: %s: %s", type(exc).__name__, exc)
        result["train"] = [f"reranker: failed ({type(exc).__name__}: {exc})"]
    for line in result["train"]:
        get_run_logger().info("%s", line)
    return result


@flow(name="backfill", task_runner=_threads(2))
def backfill_flow(path: str, fmt: str, overrides: dict[str, Any] | None = None,
                  observations_as_fragments: bool = False, settings: Settings | None = None,
                  user_id: str | None = None) -> dict[str, Any]:
    """A whole archive: ingest it, then consolidate its users shard by shard. Resumable: a re-run
    skips what was committed (watermarks) and re-pays no LLM call (response cache)."""
    resolved = resolve_settings(settings, overrides)
    with run_lease(resolved.store, resolved.run_lease_wait_s, resolved.lease_backend, resolved.lease_ttl_s):
        report = ingest(open_store(resolved), path, fmt, observations_as_fragments=observations_as_fragments,
                        user_id=user_id)
        get_run_logger().info(report.summary())
        if not report.users:   # no message read: nothing of this archive to consolidate (None is every user)
            status = "unreadable" if report.quarantined else "completed"
            (get_run_logger().error if report.quarantined else get_run_logger().info)(
                "backfill: no message of %s could be read; nothing consolidated", path)
            return {"ingest": report.summary(), "status": status,
                    "summary": "backfill: no message of the archive was read; nothing consolidated"}
        result = _run("backfill", report.users, resolved)
        result["ingest"] = report.summary()
        return result


def run_flow(name: str, settings: Settings, **params: Any) -> dict[str, Any]:
    """Run a flow with the task runner these settings ask for, handing it these settings.

    Takes the store's run lease first (`RunInProgressError` while another run holds it, before
    Prefect starts anything), then stops temporary Prefect servers left by killed runs and starts
    (and records) this process's own. A Dask scheduler (`dask_address`) is reached first, before the
    lease (`check_scheduler`)."""
    flows: dict[str, Any] = {"consolidate": consolidate_flow, "backfill": backfill_flow}
    settings = absolute_store(settings)   # handed to the task runner: a relative path is this folder's
    if settings.dask_address:
        check_scheduler(settings.dask_address)
    with run_lease(settings.store, settings.run_lease_wait_s, settings.lease_backend, settings.lease_ttl_s):
        reap_orphans()
        start_recorded()
        result: dict[str, Any] = flows[name].with_options(task_runner=task_runner_for(settings))(
            settings=settings, **params)
    return result
