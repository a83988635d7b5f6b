"""`mnemo retrieve`, `mnemo serve`, `mnemo bench locomo`, `mnemo bench retrieval`, added to the
lead's CLI by `register(app, bench_app)` (flows/cli.py). The store comes from the global --store
option (`ctx.obj["settings"].store`); retrieval knobs from MNEMO_RETRIEVAL_* variables."""
from __future__ import annotations

import json
from typing import Optional

import typer

from memory.settings import Settings
from retrieval.settings import RetrievalSettings


def _mnemo(ctx: typer.Context) -> Settings:
    if ctx.obj and "settings" in ctx.obj:
        return ctx.obj["settings"]
    from memory.settings import get_settings

    return get_settings()


def _retriever(ctx: typer.Context, **overrides: object):  # type: ignore[no-untyped-def]
    from retrieval.retriever import Retriever

    mnemo = _mnemo(ctx)
    return Retriever.open(mnemo.store, RetrievalSettings().with_overrides(**overrides), mnemo_settings=mnemo)


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add the retrieval commands to the `mnemo` app and its `bench` group."""

    @app.command()
    def retrieve(
        ctx: typer.Context,
        user: str = typer.Argument(..., help="user id"),
        query: str = typer.Argument(..., help="the question"),
        k: Optional[int] = typer.Option(None, "--k", help="items to return [default 10]"),
        strategy: Optional[str] = typer.Option(None, "--strategy", help="dense | familiarity | recollection | "
                                               "rfmem | hybrid | rfmem-hybrid | calibrated [default: best]"),
        as_json: bool = typer.Option(False, "--json", help="print the whole result as JSON"),
        max_tokens: int = typer.Option(1500, "--max-tokens", help="token budget of the printed context"),
    ) -> None:
        """Retrieve one user's memories for a query and print them (or their context)."""
        res = _retriever(ctx).retrieve(user, query, k=k, strategy=strategy)
        if as_json:
            typer.echo(json.dumps(res.to_dict(), indent=2, default=str))
            return
        t = res.signals.get("timings", {})
        typer.echo(f"{len(res.items)} items, strategy {res.strategy}, route {res.route}, "
                   f"retrieval {t.get('retrieve_ms', 0):.1f} ms (+ embedding {t.get('embed_ms', 0):.1f} ms)")
        for i, it in enumerate(res.items):
            typer.echo(f"{i:>2} {it.score:6.3f} {it.kind:<9} [{it.date or ''}] {it.text[:120]}")
        if res.items:
            typer.echo("\n" + res.context(max_tokens=max_tokens))

    @app.command()
    def serve(
        ctx: typer.Context,
        host: Optional[str] = typer.Option(None, "--host", help="bind address [default 127.0.0.1]"),
        port: Optional[int] = typer.Option(None, "--port", help="port [default 8765]"),
    ) -> None:
        """Serve retrieval over HTTP (FastAPI; docs at /docs). MNEMO_API_KEY turns on bearer auth."""
        from retrieval.service import serve as run

        r = _retriever(ctx)
        run(r, host or r.settings.host, port or r.settings.port)

    @bench_app.command("locomo")
    def bench_locomo(
        ctx: typer.Context,
        path: str = typer.Argument(..., help="LoCoMo JSON file"),
        extraction: str = typer.Option("rules", "--extraction", help="rules | observations"),
        strategies: Optional[str] = typer.Option(None, "--strategies", help="comma-separated [default: all]"),
        ks: str = typer.Option("5,10", "--k", help="comma-separated K values"),
        store: Optional[str] = typer.Option(None, "--store", help="store dir (default: a temporary one)"),
    ) -> None:
        """Evidence Recall@K per LoCoMo category and strategy, with retrieval latency."""
        from retrieval.bench import bench_locomo as run

        typer.echo(run(path, extraction=extraction, strategies=_csv(strategies) if strategies else None,
                       ks=[int(k) for k in _csv(ks)], store=store))

    @bench_app.command("retrieval")
    def bench_retrieval(
        memories: int = typer.Option(10_000, "--memories", help="size of the synthetic user's memory"),
        queries: int = typer.Option(200, "--queries", help="timed queries per strategy"),
    ) -> None:
        """Latency on one synthetic user: warm, cold, familiarity vs rfmem."""
        from retrieval.bench_latency import bench_retrieval as run

        typer.echo(run(memories=memories, queries=queries))
