"""The whole HTTP service: the read routes of `retrieval.service` plus the routes that write memory.

`retrieval.service` only reads (retrieve, context) and records feedback; writing routes (appends,
forget) need the ingest and consolidation layers below `flows`, so they are added here, each by the
`register(app, retriever)` function of its own module. `mnemo serve` runs this app.
"""
from __future__ import annotations

from fastapi import FastAPI

from retrieval.retriever import Retriever
from retrieval.service import create_app as create_read_app


def create_app(retriever: Retriever) -> FastAPI:
    """The FastAPI app serving one retriever, its store's write routes included."""
    app = create_read_app(retriever)
    # write routes: each module adds its own, e.g. `api_append.register(app, retriever)`
    return app


def serve(retriever: Retriever, host: str, port: int) -> None:
    """Run the whole service with uvicorn until interrupted, BLAS single-threaded (requests run in
    parallel threads; one query's matrix products are too small to gain from a BLAS pool)."""
    import uvicorn
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")
    uvicorn.run(create_app(retriever), host=host, port=port, log_level="info")
