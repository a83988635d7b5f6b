"""`mnemo bench ...`: every benchmark of the `evaluation` package, printing its figures.

Each benchmark gets the root settings (environment and global flags) as its base; those that
consolidate use their own store (`--store`, default a temporary one) and the `rules` backend.
"""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from flows.cli.context import csv, settings_of

#: the options and arguments several benchmarks share
StoreDir = Annotated[Optional[str], typer.Option("--store", help="store dir (default: a temporary one)")]
ScaleStores = Annotated[Optional[str], typer.Option("--store", help="store root, one store per scale under it; "
                                                    "chats already consolidated there are reused "
                                                    "(default: temporary ones)")]
Scales = Annotated[Optional[str], typer.Option("--scales", help="comma-separated, e.g. 100K,500K,1M "
                                               "(default: every scale folder under DIR)")]
LocomoFile = Annotated[str, typer.Argument(help="LoCoMo JSON file")]
BeamDir = Annotated[str, typer.Argument(help="BEAM folder holding SCALE/N/{chat,probing_questions}.json")]


def bench_consolidate(
    ctx: typer.Context,
    path: LocomoFile,
    fmt: str = typer.Option("locomo", "--format", "-f"),
    store: StoreDir = None,
) -> None:
    """Ingest + consolidate with the `rules` backend and print throughput figures."""
    from evaluation.consolidate import bench_consolidate as run

    typer.echo(run(path, fmt, store=store, settings=settings_of(ctx)))


def bench_locomo(
    ctx: typer.Context,
    path: LocomoFile,
    extraction: str = typer.Option("rules", "--extraction", help="rules | observations"),
    strategies: Optional[str] = typer.Option(None, "--strategies", help="comma-separated [default: all]"),
    ks: str = typer.Option("5,10", "--k", help="comma-separated K values"),
    store: StoreDir = None,
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
    path: LocomoFile,
    strategies: str = typer.Option("walk,hybrid-walk,rfmem-hybrid", "--strategies"),
) -> None:
    """Consolidate in two batches and compare Recall@10 with a rebuild of the same store."""
    from evaluation.incremental import bench_incremental as run

    typer.echo(run(path, csv(strategies), settings=settings_of(ctx)))


def bench_rerank(
    ctx: typer.Context,
    path: LocomoFile,
    store: StoreDir = None,
    strategy: Optional[str] = typer.Option(None, "--strategy", help="base strategy [default: the default]"),
    scope: str = typer.Option("global", "--scope", help="global | user"),
    epochs: Optional[int] = typer.Option(None, "--epochs", min=1, help="passes over the feedback "
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
    path: BeamDir,
    scales: Scales = None,
    strategies: Optional[str] = typer.Option(None, "--strategies", help="comma-separated (default: dense, "
                                             "familiarity, rfmem, rfmem-hybrid and the default strategy)"),
    copies: int = typer.Option(1, "--users-copies", help="file every chat under N distinct user ids "
                               "(consolidated too; questions asked of the first)"),
    store: ScaleStores = None,
    nightly_users: int = typer.Option(0, "--nightly-users", help="also time a nightly run adding one session "
                                      "to one user of a store of N users cloned from the scale's vs a 1-user one"),
) -> None:
    """Evidence Recall@K per BEAM ability and strategy, update-first, retrieval latency and
    consolidation cost, one table per scale."""
    from evaluation.beam_report import beam_reports

    for i, text in enumerate(beam_reports(path, scales=csv(scales) or None, strategies=csv(strategies) or None,
                                          copies=copies, store=store, settings=settings_of(ctx),
                                          nightly_users=nightly_users)):
        typer.echo(("\n" if i else "") + text)


def bench_beam_anchors(
    ctx: typer.Context,
    path: BeamDir,
    scales: Scales = None,
    keep_markers: bool = typer.Option(False, "--keep-markers", help="embed and search the content as published, "
                                      "`->-> i,j` markers included (how ANCHORS.md was measured)"),
) -> None:
    """The raw-message anchors of ANCHORS.md (dense, BM25, their fusion; no mnemo) on the text the
    `beam` reader stores (markers stripped), or as published."""
    from evaluation.beam_anchors import bench_beam_anchors as run

    typer.echo(run(path, scales=csv(scales) or None, keep_markers=keep_markers, settings=settings_of(ctx)))


def bench_appends(
    ctx: typer.Context,
    archive: Optional[str] = typer.Option(None, "--archive", help="archive consolidated for the reader's user "
                                          "(default: examples/sample.jsonl)"),
    fmt: str = typer.Option("jsonl", "--format", "-f"),
    seconds: float = typer.Option(10.0, "--seconds", help="how long the writers and the reader run"),
    batch: int = typer.Option(100, "--batch", help="turns per append batch"),
    writers: int = typer.Option(1, "--writers", help="concurrent append clients (one user each)"),
    readers: int = typer.Option(1, "--readers", help="concurrent retrieval clients (0: appends alone)"),
    rate: float = typer.Option(1000.0, "--rate", help="messages/s the writers offer together "
                               "(0: as fast as answered)"),
    store: StoreDir = None,
) -> None:
    """Sustained appends over HTTP (batches of 100) with retrieval p50/p99 for another user meanwhile."""
    from evaluation.appends import bench_appends as run

    typer.echo(run(archive, fmt, seconds=seconds, batch=batch, writers=writers, readers=readers, rate=rate,
                   store=store, settings=settings_of(ctx)))


def bench_updates(
    ctx: typer.Context,
    path: BeamDir,
    scales: Scales = None,
    store: ScaleStores = None,
) -> None:
    """Update-first, updated-message Recall@10 and flagged contradictions on BEAM, with the validity
    ordering on vs off (evaluation/updates.py)."""
    from evaluation.updates import bench_updates as run

    typer.echo(run(path, scales=csv(scales) or None, store=store, settings=settings_of(ctx)))


def bench_llm(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="LoCoMo JSON file (its first conversation is used)"),
    sessions: int = typer.Option(3, "--sessions", help="the conversation's first N sessions"),
    model: str = typer.Option("smollm2-135m", "--model", help="packaged model of the local llama.cpp server "
                              "(smollm2-135m; needs the local-llm extra)"),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="use this OpenAI-compatible server instead "
                                           "(model name from --llm-model / MNEMO_LLM_MODEL)"),
    llm_model: Optional[str] = typer.Option(None, "--llm-model", help="model name the --base-url server serves"),
    max_tokens: int = typer.Option(192, "--max-tokens", help="answer token limit"),
    concurrency: str = typer.Option("1,2,4,8", "--concurrency", help="concurrencies tried for the server alone"),
    store: StoreDir = None,
) -> None:
    """Consolidate a LoCoMo slice through a real LLM server: requests and tokens per session and stage,
    parse failures, quarantine rate, junk fragments, Recall@10 next to rules and recorded observations,
    and the LLM efficiency (pipeline tokens/s over the server's own best on the same requests)."""
    from evaluation.llm import bench_llm as run

    settings = settings_of(ctx).with_overrides(llm_model=llm_model)
    typer.echo(run(path, sessions=sessions, model=model, base_url=base_url, max_tokens=max_tokens,
                   concurrencies=[_int(c, "--concurrency") for c in csv(concurrency)], store=store,
                   settings=settings))


def bench_forget(
    ctx: typer.Context,
    path: LocomoFile,
    which: str = typer.Option("middle", "--which", help="the session forgotten per user: first | middle | last"),
    store: StoreDir = None,
) -> None:
    """Forget one session per LoCoMo user: wall time, rows deleted and re-derived per table, LLM calls
    paid and cache hits, bytes reclaimed, Recall@10 outside the forgotten sessions before vs after."""
    from evaluation.forget import bench_forget as run

    if which not in ("first", "middle", "last"):
        raise typer.BadParameter(f"{which!r} is not one of first, middle, last", param_hint="--which")
    typer.echo(run(path, which=which, store=store, settings=settings_of(ctx)))


def _int(value: str, flag: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not an integer", param_hint=flag) from None


def register(bench_app: typer.Typer) -> None:
    """Add every benchmark to the `bench` group."""
    bench_app.command("consolidate")(bench_consolidate)
    bench_app.command("forget")(bench_forget)
    bench_app.command("locomo")(bench_locomo)
    bench_app.command("retrieval")(bench_retrieval)
    bench_app.command("incremental")(bench_incremental)
    bench_app.command("rerank")(bench_rerank)
    bench_app.command("beam")(bench_beam)
    bench_app.command("beam-anchors")(bench_beam_anchors)
    bench_app.command("llm")(bench_llm)
    bench_app.command("updates")(bench_updates)
    bench_app.command("appends")(bench_appends)
