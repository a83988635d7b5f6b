"""`mnemo bench ...`: every benchmark of the `evaluation` package, printing its figures.

Each benchmark gets the root settings (environment and global flags) as its base; those that
consolidate use their own store (`--store`, default a temporary one) and the `rules` backend.
"""
from __future__ import annotations

from typing import Optional

import typer

from flows.cli.context import csv, settings_of


def bench_consolidate(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="LoCoMo JSON file"),
    fmt: str = typer.Option("locomo", "--format", "-f"),
    store: Optional[str] = typer.Option(None, "--store", help="store dir (default: a temporary one)"),
) -> None:
    """Ingest + consolidate with the `rules` backend and print throughput figures."""
    from evaluation.consolidate import bench_consolidate as run

    typer.echo(run(path, fmt, store=store, settings=settings_of(ctx)))


def bench_locomo(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="LoCoMo JSON file"),
    extraction: str = typer.Option("rules", "--extraction", help="rules | observations"),
    strategies: Optional[str] = typer.Option(None, "--strategies", help="comma-separated [default: all]"),
    ks: str = typer.Option("5,10", "--k", help="comma-separated K values"),
    store: Optional[str] = typer.Option(None, "--store", help="store dir (default: a temporary one)"),
) -> None:
    """Evidence Recall@K per LoCoMo category and strategy, with retrieval latency."""
    from evaluation.locomo import bench_locomo as run

    typer.echo(run(path, extraction=extraction, strategies=csv(strategies) or None,
                   ks=[_int(k, "--k") for k in csv(ks)], store=store, settings=settings_of(ctx)))


def bench_retrieval(
    ctx: typer.Context,
    memories: int = typer.Option(10_000, "--memories", help="size of the synthetic user's memory"),
    queries: int = typer.Option(200, "--queries", help="timed queries per strategy"),
) -> None:
    """Latency on one synthetic user: warm, cold, familiarity vs rfmem."""
    from evaluation.latency import bench_retrieval as run

    typer.echo(run(memories=memories, queries=queries, settings=settings_of(ctx)))


def bench_incremental(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="LoCoMo JSON file"),
    strategies: str = typer.Option("walk,hybrid-walk,rfmem-hybrid", "--strategies"),
) -> None:
    """Consolidate in two batches and compare Recall@10 with a rebuild of the same store."""
    from evaluation.incremental import bench_incremental as run

    typer.echo(run(path, csv(strategies), settings=settings_of(ctx)))


def bench_rerank(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="LoCoMo JSON file"),
    store: Optional[str] = typer.Option(None, "--store", help="store dir (default: a temporary one)"),
    strategy: Optional[str] = typer.Option(None, "--strategy", help="base strategy [default: the default]"),
    scope: str = typer.Option("global", "--scope", help="global | user"),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="passes over the feedback "
                                         "[default: settings rerank_epochs]"),
    reset: bool = typer.Option(False, "--reset", help="drop the store's feedback and rerankers first"),
    explore: bool = typer.Option(True, "--explore/--no-explore",
                                 help="simulated feedback on Gumbel-sampled (paper) or deterministic top-5"),
) -> None:
    """Train a reranker from simulated citations on half of LoCoMo, compare Recall@5 on the other
    half with and without it, time it, and measure topic memories' effect on Recall@10."""
    from evaluation.rerank import bench_rerank as run

    typer.echo(run(path, store=store, strategy=strategy, epochs=epochs, scope=scope, reset=reset,
                   explore=explore, settings=settings_of(ctx)))


def bench_beam(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="BEAM folder holding SCALE/N/{chat,probing_questions}.json"),
    scales: Optional[str] = typer.Option(None, "--scales", help="comma-separated, e.g. 100K,500K,1M "
                                         "(default: every scale folder under DIR)"),
    strategies: Optional[str] = typer.Option(None, "--strategies", help="comma-separated (default: dense, "
                                             "familiarity, rfmem, rfmem-hybrid and the default strategy)"),
    copies: int = typer.Option(1, "--users-copies", help="file every chat under N distinct user ids "
                               "(consolidated too; questions asked of the first)"),
    store: Optional[str] = typer.Option(None, "--store", help="store root, one store per scale under it "
                                        "(default: temporary ones)"),
) -> None:
    """Evidence Recall@K per BEAM ability and strategy, update-first, retrieval latency and
    consolidation cost, one table per scale."""
    from evaluation.beam import beam_reports

    for i, text in enumerate(beam_reports(path, scales=csv(scales) or None, strategies=csv(strategies) or None,
                                          copies=copies, store=store, settings=settings_of(ctx))):
        typer.echo(("\n" if i else "") + text)


def _int(value: str, flag: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not an integer", param_hint=flag) from None


def register(bench_app: typer.Typer) -> None:
    """Add every benchmark to the `bench` group."""
    bench_app.command("consolidate")(bench_consolidate)
    bench_app.command("locomo")(bench_locomo)
    bench_app.command("retrieval")(bench_retrieval)
    bench_app.command("incremental")(bench_incremental)
    bench_app.command("rerank")(bench_rerank)
    bench_app.command("beam")(bench_beam)
