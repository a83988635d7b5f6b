"""The `mnemo` command line: ingest, consolidate, backfill, stats, bench (and, from
`retrieval.cli`, retrieve / serve / bench locomo). Settings come from MNEMO_* environment
variables; flags override them."""
from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any, Optional

import typer
from rich.console import Console

from memory.errors import MnemoError
from memory.settings import Settings, get_settings

app = typer.Typer(help="mnemo: long-term memory for LLM assistants.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
bench_app = typer.Typer(help="Benchmarks that print figures.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
console = Console(stderr=True)


def _settings(ctx: typer.Context) -> Settings:
    return ctx.obj["settings"]


@app.callback()
def main_options(
    ctx: typer.Context,
    store: Optional[str] = typer.Option(None, "--store", help="LanceDB directory or URI [env MNEMO_STORE, default ./memstore]"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="debug logging"),
) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for noisy in ("httpx", "sentence_transformers", "transformers", "distributed", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    ctx.obj = {"settings": get_settings().with_overrides(store=store)}


def _users(users: str | None) -> list[str] | None:
    return [u.strip() for u in users.split(",") if u.strip()] if users else None


@app.command()
def ingest(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="archive file"),
    fmt: str = typer.Option(..., "--format", "-f", help="locomo | longmemeval | jsonl | parquet"),
    observations_as_fragments: bool = typer.Option(False, "--observations-as-fragments",
                                                   help="LoCoMo: import recorded observations as fragments"),
) -> None:
    """Validate and load an archive into the store; bad rows are quarantined with their reason."""
    from memory.ingest import ingest as do_ingest
    from memory.runs import open_store

    report = do_ingest(open_store(_settings(ctx)), path, fmt, observations_as_fragments=observations_as_fragments)
    typer.echo(report.summary())


def _overrides(settings: Settings, **flags: Any) -> dict[str, Any]:
    out = {"store": settings.store}
    out.update({k: v for k, v in flags.items() if v is not None})
    return out


@app.command()
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
    settings = _settings(ctx).with_overrides(llm=llm, llm_model=llm_model, dask_local=dask_local,
                                             dask_address=dask_address, rebuild_graph=rebuild_graph or None)
    overrides = _overrides(settings, llm=llm, llm_model=llm_model, rebuild_graph=rebuild_graph or None)
    if engine == "local":
        from rich.progress import Progress

        from memory.runs import consolidate as run_local, open_store, plan_shards

        store = open_store(settings)
        shards = plan_shards(store, _users(users), settings.shard_size)
        with Progress(console=console, transient=True) as progress:
            bar = progress.add_task("consolidating shards", total=len(shards))
            report = run_local(store, settings, on_shard=lambda _: progress.advance(bar), shards=shards)
        typer.echo(report.summary())
        return
    from flows.consolidate import run_flow

    result = run_flow("consolidate", settings, users=_users(users), overrides=overrides)
    typer.echo(result["summary"])


@app.command()
def backfill(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="archive file"),
    fmt: str = typer.Option(..., "--format", "-f", help="locomo | longmemeval | jsonl | parquet"),
    observations_as_fragments: bool = typer.Option(False, "--observations-as-fragments"),
    llm: Optional[str] = typer.Option(None, "--llm"),
    llm_model: Optional[str] = typer.Option(None, "--llm-model"),
    dask_local: Optional[int] = typer.Option(None, "--dask-local"),
    dask_address: Optional[str] = typer.Option(None, "--dask-address"),
) -> None:
    """Ingest and consolidate a whole archive, sharded; run it again to resume after a crash."""
    from flows.consolidate import run_flow

    settings = _settings(ctx).with_overrides(llm=llm, llm_model=llm_model, dask_local=dask_local,
                                             dask_address=dask_address)
    result = run_flow("backfill", settings, path=path, fmt=fmt, overrides=_overrides(settings, llm=llm, llm_model=llm_model),
                      observations_as_fragments=observations_as_fragments)
    typer.echo(result["ingest"])
    typer.echo(result["summary"])


@app.command()
def stats(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="machine-readable counts")) -> None:
    """Counts per user and memory kind."""
    from memory.runs import open_store, stats as store_stats

    data = store_stats(open_store(_settings(ctx)))
    if as_json:
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    from rich.table import Table

    users = data["users"]
    kinds = sorted({k for row in users.values() for k in row})
    table = Table("user", *kinds, title=f"store {_settings(ctx).store}")
    for user, row in users.items():
        table.add_row(user, *(str(row.get(k, 0)) for k in kinds))
    Console().print(table)
    typer.echo(f"{len(users)} users")


@bench_app.command("consolidate")
def bench_consolidate(
    path: str = typer.Argument(..., help="LoCoMo JSON file"),
    fmt: str = typer.Option("locomo", "--format", "-f"),
    store: Optional[str] = typer.Option(None, "--store", help="store dir (default: a temporary one)"),
) -> None:
    """Ingest + consolidate with the `rules` backend and print throughput figures."""
    from memory.benchmark import bench_consolidate as run

    typer.echo(run(path, fmt, store=store))


#: modules that add their commands with `register(app, bench_app)`
COMMAND_MODULES = ("retrieval.cli", "flows.cli_memweaver", "flows.cli_rmm")


def _register_plugins() -> None:
    import importlib

    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(app, bench_app)


_register_plugins()


def main() -> None:
    """Console-script entry point: user-facing errors print one line, not a traceback."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        app()
    except MnemoError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
