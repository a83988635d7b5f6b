"""`mnemo consolidate` (nightly, by watermark) and `mnemo backfill` (a whole archive, sharded).

Flags override the settings read at the root; the resulting Settings go to the Prefect flow
(`flows.consolidate.run_flow`) or, with `--engine local`, to `memory.runs.consolidate` directly.
Both hold the store's run lease for the whole run: while another run holds it (after waiting
`run_lease_wait_s`), the command prints why and exits 75 ("skipped, still running").
"""
from __future__ import annotations

from typing import Optional

import typer

from flows.cli.context import console, csv, finish_run, settings_of
from memory.errors import ConfigError

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
    settings = settings_of(ctx).with_overrides(llm=llm, llm_model=llm_model, dask_local=dask_local,
                                               dask_address=dask_address, rebuild_graph=rebuild_graph or None)
    chosen = csv(users) or None
    if engine == "local":
        from rich.progress import Progress

        from memory.runs import consolidate as run_local, open_store, plan_shards

        store = open_store(settings)
        shards = plan_shards(store, chosen, settings.shard_size)
        with Progress(console=console, transient=True) as progress:
            bar = progress.add_task("consolidating shards", total=len(shards))
            report = run_local(store, settings, on_shard=lambda _: progress.advance(bar), shards=shards)
        typer.echo(report.summary())
        finish_run(report.status)
        return
    from flows.consolidate import run_flow

    result = run_flow("consolidate", settings, users=chosen)
    typer.echo(result["summary"])
    finish_run(result["status"])


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

    settings = settings_of(ctx).with_overrides(llm=llm, llm_model=llm_model, dask_local=dask_local,
                                               dask_address=dask_address)
    result = run_flow("backfill", settings, path=path, fmt=fmt, observations_as_fragments=observations_as_fragments,
                      user_id=user)
    typer.echo(result["ingest"])
    typer.echo(result["summary"])
    finish_run(result["status"])


def register(app: typer.Typer) -> None:
    """Add `consolidate` and `backfill` to the app."""
    app.command()(consolidate)
    app.command()(backfill)
