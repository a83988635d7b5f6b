"""The whole HTTP service: the read routes of `retrieval.service` plus the routes that write memory.

`retrieval.service` only reads (retrieve, context) and records feedback; writing routes (appends,
forget) need the ingest and consolidation layers below `flows`, so they are added here, each by the
`register(app, retriever)` function of its own module. `mnemo serve` runs this app, its store's
writes waiting at most `RetrievalSettings.write_wait_s` for the write lease (`configure_writes`).
"""
from __future__ import annotations

import gc
import logging
from typing import Any

from fastapi import FastAPI

from flows import api_append, api_forget
from memory.embed import single_threaded
from memory.errors import ConfigError
from memory.settings import Settings
from retrieval.guard import open_without_key
from retrieval.retriever import Retriever
from retrieval.service import create_app as create_read_app

log = logging.getLogger(__name__)


def create_app(retriever: Retriever, settings: Settings | None = None) -> FastAPI:
    """The FastAPI app serving one retriever, its store's write routes included (`settings`: the
    store's full settings, for the routes that re-run consolidation stages: forget)."""
    app = create_read_app(retriever)
    # write routes: each module adds its own, e.g. `api_append.register(app, retriever)`
    api_append.register(app, retriever)
    api_forget.register(app, retriever, settings)
    return app


def serve(retriever: Retriever, host: str, port: int, settings: Settings | None = None) -> None:
    """Run the whole service with uvicorn until interrupted, BLAS, torch and ONNX Runtime single-threaded (requests
    run in parallel threads; one query's matrix products and its embedding are too small to gain from
    a pool, and torch's pool stalls a query embedding for ~1 s on a busy machine). An address that
    cannot be bound is a `ConfigError` (`run_server`)."""
    warning = open_without_key(host, retriever.settings.api_key is not None)
    if warning:
        log.warning(warning)
    single_threaded()
    configure_writes(retriever, settings)
    app = create_app(retriever, settings)
    retriever.embed(["warm up"])   # the embedder loaded now, not by the first query
    # everything loaded so far (the model, the libraries: ~0.5 M objects) is moved out of the collector's
    # reach: a full collection would otherwise scan it all, stopping every request for 0.2-0.4 s
    gc.freeze()
    run_server(app, host, port, "MNEMO_RETRIEVAL_HOST, MNEMO_RETRIEVAL_PORT")


def run_server(app: Any, host: str, port: int, settings_hint: str) -> None:
    """uvicorn until interrupted; an address it cannot bind (a port in use) is a `ConfigError` naming
    it (`settings_hint`: where the address comes from): uvicorn would exit 3, the code of a
    consolidation that set LLM work aside. The HTTP service and the MCP server both run through it."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info"))
    try:
        server.run()
    except SystemExit:   # uvicorn's exit when it cannot bind (it logged why: the OSError's one line)
        if server.started:
            raise
        raise ConfigError(f"cannot serve on {host}:{port}: the address is in use or cannot be bound (see the "
                          f"log line above); choose another --host / --port ({settings_hint})",
                          host=host, port=port) from None


def configure_writes(retriever: Retriever, settings: Settings | None = None) -> None:
    """Make the served store's writes wait at most `retrieval.write_wait_s` for the write lease (a
    refused write answers 503 at once instead of holding a request thread for the default 30 s),
    with the lease backend and lifetime of `settings` (those of every other writer of the store)."""
    store = retriever.store
    store.write_lease_wait_s = retriever.settings.write_wait_s
    if settings is not None:
        store.lease_backend, store.lease_ttl_s = settings.lease_backend, settings.lease_ttl_s
