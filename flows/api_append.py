"""`POST /v1/users/{user_id}/messages`: an assistant appends the turns it has just had (RMM-style live
memory); the next consolidation run makes them memory.

Body `{"messages": [{"session_id", "message_id", "speaker" | "role", "text", "timestamp"}, ...]}`. Each
turn is validated exactly like an ingested row (`memory.ingest.append`): bad turns are quarantined and
listed in the answer with their index and reason, the others written; a message id already stored with
the same text is counted as a duplicate (re-sending a batch adds nothing), with other text quarantined.
Answers: 200 with the counts; 413 for a body over `RetrievalSettings.append_max_bytes` (refused while it
streams, by `retrieval.guard`) or more turns than `append_max_messages`; 422 for a malformed body or
user id, or a turn nested deeper than `MAX_TURN_DEPTH` lists / objects (`too_deep`: a turn's unknown
fields are kept in its stored raw row, so they are bounded here, naming the field, before the batch is
pickled for the worker); 503 when the store's writer lease stayed busy for `write_wait_s` (retry later).
Every `append_compact_every` batches the tables appends write are compacted in the background
(`memory.ingest.append.Compactor`), so reads stay fast under a stream. With `append_process` (the
default) the batches are written by a child process at `append_nice`
(`memory.ingest.append_worker.AppendWorker`), so appends never hold the interpreter lock that retrieval
needs; the route awaits it without holding a thread.
"""
from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from memory.errors import AppendTooLargeError
from memory.ingest.append import Compactor
from memory.ingest.append_worker import AppendWorker, BatchNotSendableError
from retrieval.guard import allow_body
from retrieval.retriever import Retriever

#: the paths of the append route (their own, larger, body limit)
APPEND_PATHS = r"/v1/users/[^/]+/messages"
#: the most lists / objects a turn may nest, itself included (its known fields are flat; unknown
#: ones are kept in the stored raw row, and a deep one would break the worker's pickling)
MAX_TURN_DEPTH = 32
#: the longest field name a refusal repeats
_NAME_CHARS = 100


class AppendRequest(BaseModel):
    messages: list[Any] = Field(..., min_length=1, description="turns: objects with session_id, message_id, "
                                "speaker (or role), text and an ISO 8601 timestamp; bad ones are quarantined")


def _nests_over(value: Any, limit: int) -> bool:
    """Does `value` nest more than `limit` lists / objects (a scalar: none)? Iterative: any depth."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def too_deep(turns: list[Any], max_depth: int = MAX_TURN_DEPTH) -> list[dict[str, Any]]:
    """Validation errors (`type`, `loc`, `msg`) naming each turn, or each field of a turn, that nests
    more than `max_depth` lists / objects (the turn counts as one); empty when none does."""
    errors: list[dict[str, Any]] = []
    msg = f"nested deeper than {max_depth} levels (a turn is a flat object: session_id, message_id, speaker, " \
          "text, timestamp)"
    for i, turn in enumerate(turns):
        if isinstance(turn, dict):
            for key, value in turn.items():
                if isinstance(value, (dict, list)) and _nests_over(value, max_depth - 1):
                    # the name as JSON can carry it (a lone surrogate escaped), and not too long
                    name = str(key)[:_NAME_CHARS].encode("utf-8", "backslashreplace").decode("utf-8")
                    errors.append({"type": "too_deep", "loc": ("body", "messages", i, name), "msg": msg})
        elif isinstance(turn, list) and _nests_over(turn, max_depth):
            errors.append({"type": "too_deep", "loc": ("body", "messages", i), "msg": msg})
    return errors


def checked(body: AppendRequest) -> list[Any]:
    """The body's turns; RequestValidationError (422) if one is nested too deep (`too_deep`)."""
    errors = too_deep(body.messages)
    if errors:
        raise RequestValidationError(errors)
    return body.messages


def register(app: FastAPI, retriever: Retriever) -> None:
    """Add the append route (and its body limit) to the service app; with `append_process`, its
    worker process too (started and stopped with the app)."""
    settings = retriever.settings
    allow_body(app, APPEND_PATHS, settings.append_max_bytes)

    @app.exception_handler(AppendTooLargeError)
    async def too_large(_: Request, exc: AppendTooLargeError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=413)

    @app.exception_handler(BatchNotSendableError)
    async def not_sendable(_: Request, exc: BatchNotSendableError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)   # the caller's turns, not the worker

    if settings.append_process and not retriever.store.uri.startswith("memory://"):
        worker = AppendWorker(retriever.store, wait_s=settings.write_wait_s,
                              compact_every=settings.append_compact_every, nice=settings.append_nice)
        app.router.on_startup.append(worker.start)
        app.router.on_shutdown.append(worker.close)

        @app.post("/v1/users/{user_id}/messages")
        async def append_messages(user_id: str, body: AppendRequest) -> dict[str, Any]:
            """Append a batch of the user's turns: counts, and the quarantined turns with their reasons."""
            future = worker.submit(user_id, checked(body), settings.append_max_messages)
            return (await asyncio.wrap_future(future)).to_dict()
        return

    compactor = Compactor(retriever.store, settings.append_compact_every)

    @app.post("/v1/users/{user_id}/messages")
    def append_messages_here(user_id: str, body: AppendRequest) -> dict[str, Any]:
        """Append a batch of the user's turns: counts, and the quarantined turns with their reasons."""
        return compactor.append(user_id, checked(body), max_messages=settings.append_max_messages).to_dict()
