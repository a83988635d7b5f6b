"""`mnemo retrieve`, `mnemo serve` and `mnemo train-reranker`: the online side over a store.

The retriever opens the store of the root settings with their `retrieval` section (read from
`MNEMO_RETRIEVAL_*`); command flags override that section or the single call.
"""
from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Optional

import typer

from flows.cli.context import existing_store, settings_of, store_exists
from memory.errors import ConfigError
from memory.ids import validate_user_id
from memory.settings import Settings

if TYPE_CHECKING:
    from retrieval.retriever import Retriever

log = logging.getLogger(__name__)


def open_retriever(settings: Settings, *, serving: bool = False) -> "Retriever":
    """The retriever of these settings (their store and `retrieval` section). A local path holding
    no store is refused (a mistyped --store would answer "no memories" forever), except for a
    service (`serving`), which may start empty and be filled by appends: it warns."""
    from retrieval.retriever import Retriever

    if not serving:
        existing_store(settings)
    elif not store_exists(settings.store):
        log.warning("no store at %s yet: serving an empty one (appends fill it); check --store / MNEMO_STORE "
                    "if one was meant to be there", settings.store)
    return Retriever.open(settings.store, settings)


def retrieve(
    ctx: typer.Context,
    user: str = typer.Argument(..., help="user id"),
    query: str = typer.Argument(..., help="the question"),
    k: Optional[int] = typer.Option(None, "--k", min=1, help="items to return [default 10]"),
    strategy: Optional[str] = typer.Option(None, "--strategy", help="dense | familiarity | recollection | "
                                           "rfmem | hybrid | rfmem-hybrid | calibrated | walk | hybrid-walk | "
                                           "rfmem-walk | rfmem-hybrid-walk [default: MNEMO_RETRIEVAL_DEFAULT_STRATEGY]"),
    as_json: bool = typer.Option(False, "--json", help="print the whole result as JSON"),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", min=1, help="token budget of the printed "
                                             "context [default: MNEMO_RETRIEVAL_CONTEXT_TOKENS, 1500]"),
) -> None:
    """Retrieve one user's memories for a query and print them (or their context)."""
    user = validate_user_id(user)          # a bad id is the first error, before a missing store
    res = open_retriever(settings_of(ctx)).retrieve(user, query, k=k, strategy=strategy)
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


def serve(
    ctx: typer.Context,
    host: Optional[str] = typer.Option(None, "--host", help="bind address [default: MNEMO_RETRIEVAL_HOST, "
                                       "127.0.0.1]"),
    port: Optional[int] = typer.Option(None, "--port", help="port, 1-65535 [default: MNEMO_RETRIEVAL_PORT, 8765]"),
) -> None:
    """Serve retrieval over HTTP (FastAPI; docs at /docs). MNEMO_API_KEY turns on bearer auth."""
    from flows.service import serve as run

    flags = {"host": host, "port": port}   # validated as settings: --port 99999 is exit 2, not an OverflowError
    settings = settings_of(ctx).with_overrides(retrieval={k: v for k, v in flags.items() if v is not None})
    r = open_retriever(settings, serving=True)
    run(r, settings.retrieval.host, settings.retrieval.port, settings)


def train_reranker(
    ctx: typer.Context,
    scope: Optional[str] = typer.Option(None, "--scope", help="global | user (one version per user with feedback) "
                                        "[default: MNEMO_RETRIEVAL_RERANK_SCOPE, global]"),
    epochs: Optional[int] = typer.Option(None, "--epochs", min=1, help="passes over the new feedback "
                                         "[default: settings rerank_epochs]"),
) -> None:
    """Train the next reranker version from the feedback newer than the last one (the flow's
    `train` task, alone), holding the store's run lease like a consolidation: a forget cannot delete
    feedback while a version is trained on it."""
    from memory.lease import run_lease
    from memory.ids import new_run_id
    from retrieval.rerank import TrainConfig, train_reranker as train

    if scope is not None and scope not in ("global", "user"):
        raise ConfigError(f"unknown reranker scope {scope!r} (known: global, user)", scope=scope)
    settings = settings_of(ctx)
    scope = scope or settings.retrieval.rerank_scope   # the setting the nightly `train` task reads
    r = open_retriever(settings)
    cfg = TrainConfig.from_settings(r.settings, epochs=epochs)
    with run_lease(settings.store, settings.run_lease_wait_s, settings.lease_backend, settings.lease_ttl_s):
        reports = train(r, scope=scope, cfg=cfg, run_id=new_run_id("train"))
    for rep in reports:
        typer.echo(rep.summary())
    if not reports:
        typer.echo(f"train-reranker ({scope}): no user has feedback; nothing trained")


def register(app: typer.Typer) -> None:
    """Add `retrieve`, `serve` and `train-reranker` to the app."""
    app.command()(retrieve)
    app.command()(serve)
    app.command("train-reranker")(train_reranker)
