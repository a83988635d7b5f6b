"""The HTTP service: FastAPI over one `Retriever` (OpenAPI docs at /docs and /openapi.json).

    GET  /healthz                          liveness, no auth
    POST /v1/users/{user_id}/retrieve      {"query", "k", "strategy", "kinds"} -> items, route, signals
    POST /v1/users/{user_id}/context       {"query", "k", "strategy", "max_tokens"} -> context text
    POST /v1/users/{user_id}/feedback      {"query", "shown_ids", "cited_ids"} -> stored record id (RMM)

When an API key is configured (`RetrievalSettings.api_key`, read from MNEMO_API_KEY by
`memory.settings.load_settings`) every /v1 call needs `Authorization: Bearer <key>`
(401 otherwise). HTTP codes are chosen here only: malformed user id, unknown strategy or bad body
422; query longer than `max_query_chars` 413; unknown users get an empty result (200).
"""
from __future__ import annotations

import hmac
import logging
from typing import Any, Optional

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from memory.errors import ConfigError, InvalidUserIdError, MnemoError
from retrieval.retriever import Retriever

log = logging.getLogger(__name__)


class RetrieveRequest(BaseModel):
    query: str = Field(..., min_length=1, description="the user's question or message")
    k: Optional[int] = Field(None, ge=1, description="items to return (default: the service's k)")
    strategy: Optional[str] = Field(None, description="strategy name (default: the project's best)")
    kinds: Optional[list[str]] = Field(None, description="memory kinds to search (default: all)")
    rerank: Optional[bool] = Field(None, description="apply the RMM reranker (default: the service's setting)")


class FeedbackRequest(BaseModel):
    query: str = Field(..., min_length=1, description="the query the memories were retrieved for")
    shown_ids: list[str] = Field(..., min_length=1, description="memory ids shown to the answering LLM")
    cited_ids: list[str] = Field(default_factory=list, description="the shown ids it cited")
    reranker_version: Optional[int] = Field(None, description="reranker version that chose them, if any")


class ContextRequest(RetrieveRequest):
    max_tokens: Optional[int] = Field(None, ge=1, le=100_000, description="token budget of the context")


def create_app(retriever: Retriever) -> FastAPI:
    """The FastAPI app serving one retriever."""
    settings = retriever.settings
    app = FastAPI(title="mnemo retrieval", version="0.1.0",
                  description="RF-Mem retrieval over consolidated long-term memory.")
    key = settings.api_key.get_secret_value() if settings.api_key else None
    body_limit = settings.max_query_chars * 4 + 8192

    def authorize(request: Request) -> None:
        if key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    @app.middleware("http")
    async def limit_body(request: Request, call_next: Any) -> Any:
        size = request.headers.get("content-length")
        if size and size.isdigit() and int(size) > body_limit:
            return JSONResponse({"detail": f"request body over {body_limit} bytes"}, status_code=413)
        return await call_next(request)

    @app.exception_handler(InvalidUserIdError)
    async def bad_user(_: Request, exc: InvalidUserIdError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(ConfigError)
    async def bad_option(_: Request, exc: ConfigError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(MnemoError)
    async def failed(_: Request, exc: MnemoError) -> JSONResponse:
        log.warning("retrieval failed: %s", exc)
        return JSONResponse({"detail": str(exc)}, status_code=500)

    def _run(user_id: str, body: RetrieveRequest) -> Any:
        if len(body.query) > settings.max_query_chars:
            raise HTTPException(413, f"query longer than {settings.max_query_chars} characters")
        return retriever.retrieve(user_id, body.query, k=body.k, strategy=body.strategy, kinds=body.kinds,
                                  rerank=body.rerank)

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"status": "ok", "store": retriever.store.uri, "strategies": retriever.strategies,
                "default_strategy": settings.default_strategy}

    @app.post("/v1/users/{user_id}/retrieve", dependencies=[Depends(authorize)])
    def retrieve(user_id: str, body: RetrieveRequest) -> dict[str, Any]:
        """Ranked memories of one user for a query, with the route taken and the signals."""
        return _run(user_id, body).to_dict()

    @app.post("/v1/users/{user_id}/context", dependencies=[Depends(authorize)])
    def context(user_id: str, body: ContextRequest) -> dict[str, Any]:
        """Prompt-ready context: retrieved memories, chronological, dated, within max_tokens."""
        res = _run(user_id, body)
        return {"user_id": res.user_id, "strategy": res.strategy, "route": res.route,
                "context": res.context(max_tokens=body.max_tokens or settings.context_tokens),
                "item_ids": res.ids, "signals": res.signals}

    @app.post("/v1/users/{user_id}/feedback", dependencies=[Depends(authorize)])
    def feedback(user_id: str, body: FeedbackRequest) -> dict[str, Any]:
        """Log what the answering LLM was shown and cited (RMM); ids must be this user's memories."""
        if len(body.query) > settings.max_query_chars:
            raise HTTPException(413, f"query longer than {settings.max_query_chars} characters")
        return retriever.feedback(user_id, body.query, body.shown_ids, body.cited_ids,
                                  reranker_version=body.reranker_version)

    return app


def serve(retriever: Retriever, host: str, port: int) -> None:
    """Run the service with uvicorn until interrupted, BLAS single-threaded (requests run in
    parallel threads; one query's matrix products are too small to gain from a BLAS pool)."""
    import uvicorn
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")
    uvicorn.run(create_app(retriever), host=host, port=port, log_level="info")
