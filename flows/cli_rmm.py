"""`mnemo train-reranker` and `mnemo bench rerank` (RMM), added to the CLI by `register(app, bench_app)`.
The store comes from the global --store option (`ctx.obj["settings"]`)."""
from __future__ import annotations

from typing import Optional

import typer


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add the RMM commands to the `mnemo` app and its `bench` group."""

    @app.command("train-reranker")
    def train_reranker_cmd(
        ctx: typer.Context,
        scope: str = typer.Option("global", "--scope", help="global | user (one version per user with feedback)"),
        epochs: Optional[int] = typer.Option(None, "--epochs", help="passes over the new feedback "
                                             "[default: settings rerank_epochs]"),
    ) -> None:
        """Train the next reranker version from the feedback newer than the last one (the flow's
        `train` task, alone)."""
        from memory.runs import new_run_id
        from retrieval.rerank import TrainConfig, train_reranker
        from retrieval.retriever import Retriever

        settings = ctx.obj["settings"]
        r = Retriever.open(settings.store, mnemo_settings=settings)
        cfg = TrainConfig.from_settings(r.settings, epochs=epochs)
        for rep in train_reranker(r, scope=scope, cfg=cfg, run_id=new_run_id("train")):
            typer.echo(rep.summary())

    @bench_app.command("rerank")
    def bench_rerank_cmd(
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
        from retrieval.bench_rerank import bench_rerank

        typer.echo(bench_rerank(path, store=store, strategy=strategy, epochs=epochs, scope=scope, reset=reset,
                                explore=explore))
