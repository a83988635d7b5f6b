"""`mnemo consolidate` (nightly, by watermark) and `mnemo backfill` (a whole archive, sharded).

Flags override the settings read at the root; the resulting Settings go to the Prefect flow
(`flows.consolidate.run_flow`) or, with `--engine local`, to `memory.runs.consolidate` directly.
Both hold the store's run lease for the whole run: while another run holds it (after waiting
`run_lease_wait_s`), the command prints why and exits 75 ("skipped, still running").

`consolidate` first asks `memory.nightly` whether any user (or the reranker) has work; when none
has, it records the run and prints its summary without importing Prefect or loading a model, so a
nightly run with nothing new costs the start of Python and a few small reads. Both print the
store's data files per table after the run's compaction (`memory.runs.compact`).
"""
from __future__ import annotations

import time
from typing import Optional

import typer

from flows.cli.context import console, csv, existing_store, finish_run, settings_of
from flows.cli.ingest import unreadable
from memory.errors import ConfigError
from memory.settings import Settings

#: how `mnemo consolidate` runs the stages
ENGINES = ("prefect", "local")


def consolidate(
    ctx: typer.Context,
    llm: Optional[str] = typer.Option(None, "--llm", help="rules | openai | vllm | replay"),
    llm_model: Optional[str] = typer.Option(None, "--llm-model", help="model name for openai/vllm/replay"),
    users: Optional[str] = typer.Option(None, "--users", help="comma-separated user ids (default: all)"),
    dask_local: Optional[int] = typer.Option(None, "--dask-local", help="start a local Dask cluster of N worker processes"),
    dask_address: Optional[str] = typer.Option(None, "--dask-address", help="join an existing Dask scheduler"),
    engine: str = typer.Option("prefect", "--engine", help="prefect (flow run) | local (same stages, no Prefect)"),
    rebuild_graph: bool = typer.Option(False, "--rebuild-graph",
                                       help="rebuild each user's MemWeaver graph and summaries from scratch"),
) -> None:
    """Consolidate every user's sessions newer than its watermark."""
    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r} (known: {', '.join(ENGINES)})", engine=engine)
    if engine == "local" and (dask_local is not None or dask_address is not None):
        raise ConfigError("--engine local runs the stages in this process: --dask-local and --dask-address need "
                          "--engine prefect", engine=engine)
    settings = existing_store(settings_of(ctx).with_overrides(
        llm=llm, llm_model=llm_model, dask_local=dask_local, dask_address=dask_address,
        rebuild_graph=rebuild_graph or None))
    chosen = csv(users) or None
    if chosen:
        warn_unknown(settings, chosen)
    if not settings.rebuild_graph and nothing_to_do(settings, chosen):
        return
    if engine == "local":
        from rich.progress import Progress

        from memory.embed import embedder_for
        from memory.lease import run_lease
        from memory.runs import consolidate as run_local, open_store, plan_shards
        from retrieval.rerank import train_step
        from retrieval.retriever import Retriever

        store = open_store(settings)
        # the train step under the run's lease too, as the flow's: a forget must not delete its feedback meanwhile
        with run_lease(settings.store, settings.run_lease_wait_s, settings.lease_backend, settings.lease_ttl_s):
            shards = plan_shards(store, chosen, settings.shard_size, everyone=settings.rebuild_graph)
            with Progress(console=console, transient=True) as progress:
                bar = progress.add_task("consolidating shards", total=len(shards))
                report = run_local(store, settings, chosen, on_shard=lambda _: progress.advance(bar), shards=shards)
            trained = train_step(Retriever(store, settings, embedder_for(settings)),
                                 scope=settings.retrieval.rerank_scope, run_id=report.run_id, users=chosen)
        typer.echo(report.summary())
        typer.echo(report.compaction)
        for line in trained:
            typer.echo(line)
        finish_run(report.status)
        return
    from flows.consolidate import run_flow

    result = run_flow("consolidate", settings, users=chosen)
    typer.echo(result["summary"])
    if result.get("compaction"):
        typer.echo(result["compaction"])
    finish_run(result["status"])


def warn_unknown(settings: Settings, users: list[str]) -> None:
    """Name the `--users` the store holds no messages of: a typo must not pass for a quiet "0 users"."""
    from memory.runs import open_store

    if unknown := sorted(set(users) - set(open_store(settings).users())):
        console.print(f"[yellow]--users names users with no messages in {settings.store}: {', '.join(unknown)}[/]")


def nothing_to_do(settings: Settings, users: list[str] | None) -> bool:
    """When no user (of `users`, default all) may owe work and no feedback waits for the reranker:
    record the run, print its summary and return True, all under the run lease, before Prefect or
    a model loads (`memory.nightly`). False: the caller runs the consolidation."""
    from memory.lease import run_lease
    from memory.nightly import new_feedback, pending_users
    from memory.runs import compact, new_report, open_store

    start = time.perf_counter()
    with run_lease(settings.store, settings.run_lease_wait_s, settings.lease_backend, settings.lease_ttl_s):
        store = open_store(settings)
        if pending_users(store, users) or new_feedback(store, settings.retrieval.rerank_scope, users):
            return False
        report = new_report("consolidate", settings)
        report.seconds = time.perf_counter() - start
        store.upsert("runs", [report.runs_row()])
        report.compaction = compact(store, settings, ("runs",))
    typer.echo(report.summary())
    typer.echo(report.compaction)
    return True


def backfill(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="archive file (beam: a chat.json or a folder of SCALE/N/chat.json)"),
    fmt: str = typer.Option(..., "--format", "-f", help="locomo | longmemeval | jsonl | parquet | beam"),
    observations_as_fragments: bool = typer.Option(False, "--observations-as-fragments"),
    user: Optional[str] = typer.Option(None, "--user", help="beam: the user id of a single chat"),
    llm: Optional[str] = typer.Option(None, "--llm"),
    llm_model: Optional[str] = typer.Option(None, "--llm-model"),
    dask_local: Optional[int] = typer.Option(None, "--dask-local"),
    dask_address: Optional[str] = typer.Option(None, "--dask-address"),
) -> None:
    """Ingest and consolidate a whole archive, sharded; run it again to resume after a crash."""
    from flows.consolidate import run_flow
    from memory.ingest.validate import checked_path

    # one line, before Prefect starts or the run lease makes the store's folder
    checked_path(path, fmt, user, observations_as_fragments=observations_as_fragments)
    settings = settings_of(ctx).with_overrides(llm=llm, llm_model=llm_model, dask_local=dask_local,
                                               dask_address=dask_address)
    result = run_flow("backfill", settings, path=path, fmt=fmt, observations_as_fragments=observations_as_fragments,
                      user_id=user)
    typer.echo(result["ingest"])
    if result["status"] == "unreadable":   # no row read: nothing consolidated (never "every user")
        unreadable(path, fmt)
    typer.echo(result["summary"])
    if result.get("compaction"):
        typer.echo(result["compaction"])
    finish_run(result["status"])


def register(app: typer.Typer) -> None:
    """Add `consolidate` and `backfill` to the app."""
    app.command()(consolidate)
    app.command()(backfill)
