"""The HTTP service: FastAPI over one `Retriever` (OpenAPI docs at /docs and /openapi.json).

    GET  /healthz                          liveness, no auth
    POST /v1/users/{user_id}/retrieve      {"query", "k", "strategy", "kinds"} -> items, route, signals
    POST /v1/users/{user_id}/context       {"query", "k", "strategy", "max_tokens"} -> context text
    POST /v1/users/{user_id}/feedback      {"query", "shown_ids", "cited_ids"} -> stored record id (RMM)

When an API key is configured (`RetrievalSettings.api_key`, read from MNEMO_API_KEY by
`memory.settings.load_settings`) every call but /healthz and the docs needs
`Authorization: Bearer <key>`: `retrieval.guard.RequestGuard` answers 401 before reading any body,
and 413 as soon as a body (chunked or not) passes `max_query_chars * 12 + 8192` bytes.
HTTP codes are chosen here only: malformed user id, blank query, unknown strategy (`""` included),
unknown memory kind, out-of-range number or bad body 422 (a body that cannot be parsed at all, too
deeply nested or not UTF-8, too: FastAPI's own answer to those is 400, `unparsable_body`); query
longer than `max_query_chars` 413; unknown users get an empty result (200).

Writes (feedback here, appends and forgets of `flows.service`) take the store's write lease
(`memory.lease`) and wait for it up to the store's `write_lease_wait_s` (`mnemo serve` sets it to
`RetrievalSettings.write_wait_s`, 2 s: `flows.service.configure_writes`): while a consolidation
commits a shard they are only delayed. A write that still cannot have it gets **503** with `Retry-After:
RETRY_AFTER_BUSY_S` (`StoreBusyError`: another writer held the lease too long); a write route that
must not run during a consolidation (`RunInProgressError`) gets **409** with `Retry-After:
RETRY_AFTER_RUN_S`. Both are safe to retry as they are (every write is an idempotent upsert by id).
Reads never take a lease and never get either.
"""
from __future__ import annotations

import logging
from typing import Annotated, Any, Optional

from fastapi import FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import AfterValidator, BaseModel, Field, StrictInt
from starlette.exceptions import HTTPException as StarletteHTTPException

from memory.errors import (ConfigError, EmbedderMismatchError, InvalidUserIdError, MnemoError, RunInProgressError,
                           StoreBusyError)
from memory.schemas import MEMORY_TABLES
from retrieval.guard import RequestGuard
from retrieval.retriever import Retriever

log = logging.getLogger(__name__)


#: the largest value of a signed 64-bit integer (the store's integer columns)
INT64_MAX = 2**63 - 1
#: seconds a client is told to wait before retrying a write refused for a busy store (503)
RETRY_AFTER_BUSY_S = 2
#: seconds a client is told to wait before retrying a write refused during a consolidation run (409)
RETRY_AFTER_RUN_S = 30
#: FastAPI's detail (with 400) for a JSON body that `json.loads` failed on other than by a decode error
BODY_PARSE_ERROR = "There was an error parsing the body"


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("query is blank (whitespace only)")
    return value


#: a query: at least one character that is not whitespace
QueryText = Annotated[str, Field(min_length=1), AfterValidator(_not_blank)]


class RetrieveRequest(BaseModel):
    query: QueryText = Field(..., description="the user's question or message")
    k: Optional[StrictInt] = Field(None, ge=1, description="items to return (default: the service's k; a "
                                   "JSON integer: 2.0, \"3\" and true are refused, not coerced)")
    strategy: Optional[str] = Field(None, description="strategy name (default: the project's best; "
                                    "an empty name is refused)")
    kinds: Optional[list[str]] = Field(None, description=f"memory kinds to search (of {', '.join(MEMORY_TABLES)}; "
                                       "default: the service's kinds; unknown kinds are refused)")
    rerank: Optional[bool] = Field(None, description="apply the RMM reranker (default: the service's setting)")


class FeedbackRequest(BaseModel):
    query: QueryText = Field(..., description="the query the memories were retrieved for")
    shown_ids: list[str] = Field(..., min_length=1, description="memory ids shown to the answering LLM")
    cited_ids: list[str] = Field(default_factory=list, description="the shown ids it cited")
    reranker_version: Optional[StrictInt] = Field(None, ge=0, le=INT64_MAX,   # true is no version
                                            description="reranker version that chose them, if any")


class ContextRequest(RetrieveRequest):
    max_tokens: Optional[StrictInt] = Field(None, ge=1, le=100_000, description="token budget of the context")


def unparsable_body(exc: StarletteHTTPException) -> JSONResponse | None:
    """422 for FastAPI's 400 on a JSON body it could not parse (nested too deep for the parser: a
    RecursionError; not UTF-8), like invalid JSON gets; None for any other HTTP error."""
    if exc.status_code != 400 or exc.detail != BODY_PARSE_ERROR:
        return None
    cause = exc.__cause__
    why = ("nested too deep" if isinstance(cause, RecursionError) else
           "not UTF-8 text" if isinstance(cause, UnicodeDecodeError) else "not valid JSON")
    return JSONResponse({"detail": [{"type": "json_invalid", "loc": ["body"],
                                     "msg": f"the body cannot be parsed as JSON: {why}"}]}, status_code=422)


def create_app(retriever: Retriever) -> FastAPI:
    """The FastAPI app serving one retriever."""
    settings = retriever.settings
    app = FastAPI(title="mnemo retrieval", version="0.1.0",
                  description="RF-Mem retrieval over consolidated long-term memory.")
    key = settings.api_key.get_secret_value() if settings.api_key is not None else None
    app.add_middleware(RequestGuard, api_key=key, max_body=settings.max_query_chars * 12 + 8192)

    @app.exception_handler(RequestValidationError)
    async def bad_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own handler echoes the input back, and fails (500) on text it cannot encode
        detail = [{k: v for k, v in e.items() if k in ("type", "loc", "msg")} for e in exc.errors()]
        return JSONResponse({"detail": jsonable_encoder(detail)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return unparsable_body(exc) or await http_exception_handler(request, exc)

    @app.exception_handler(InvalidUserIdError)
    async def bad_user(_: Request, exc: InvalidUserIdError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(ConfigError)
    async def bad_option(_: Request, exc: ConfigError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(EmbedderMismatchError)
    async def mismatch(_: Request, exc: EmbedderMismatchError) -> JSONResponse:
        log.error("%s", exc)   # the service's configuration, not the request: 500, not 422
        return JSONResponse({"detail": str(exc)}, status_code=500)

    @app.exception_handler(StoreBusyError)
    async def busy(_: Request, exc: StoreBusyError) -> JSONResponse:
        log.info("write refused, store busy: %s", exc)
        return JSONResponse({"detail": str(exc)}, status_code=503,
                            headers={"Retry-After": str(RETRY_AFTER_BUSY_S)})

    @app.exception_handler(RunInProgressError)
    async def running(_: Request, exc: RunInProgressError) -> JSONResponse:
        log.info("write refused, consolidation running: %s", exc)
        return JSONResponse({"detail": str(exc)}, status_code=409,
                            headers={"Retry-After": str(RETRY_AFTER_RUN_S)})

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
        """Liveness, public: it names no store path (a bucket URI is not for unauthenticated callers)."""
        return {"status": "ok", "strategies": retriever.strategies,
                "default_strategy": settings.default_strategy}

    @app.post("/v1/users/{user_id}/retrieve")
    def retrieve(user_id: str, body: RetrieveRequest) -> dict[str, Any]:
        """Ranked memories of one user for a query, with the route taken and the signals."""
        return _run(user_id, body).to_dict()

    @app.post("/v1/users/{user_id}/context")
    def context(user_id: str, body: ContextRequest) -> dict[str, Any]:
        """Prompt-ready context: retrieved memories, chronological, dated, within max_tokens."""
        res = _run(user_id, body)
        text, shown = res.context_shown(body.max_tokens)
        return {"user_id": res.user_id, "strategy": res.strategy, "route": res.route,
                "context": text, "item_ids": shown, "signals": res.signals}

    @app.post("/v1/users/{user_id}/feedback")
    def feedback(user_id: str, body: FeedbackRequest) -> dict[str, Any]:
        """Log what the answering LLM was shown and cited (RMM); ids must be this user's memories."""
        if len(body.query) > settings.max_query_chars:
            raise HTTPException(413, f"query longer than {settings.max_query_chars} characters")
        return retriever.feedback(user_id, body.query, body.shown_ids, body.cited_ids,
                                  reranker_version=body.reranker_version)

    return app

