"""`POST /v1/users/{user_id}/messages`: an assistant appends the turns it has just had (RMM-style live
memory); the next consolidation run makes them memory.

Body `{"messages": [{"session_id", "message_id", "speaker" | "role", "text", "timestamp"}, ...]}`.
Each turn is validated exactly like an ingested row (`memory.ingest.append`): bad turns are
quarantined and listed in the answer with their index and reason, the others written; a message id
already stored with the same text is counted as a duplicate (re-sending a batch adds nothing), with
other text quarantined. Answers: 200 with the counts; 413 for a body over
`RetrievalSettings.append_max_bytes` (refused while it streams, by `retrieval.guard`) or more turns
than `append_max_messages`; 422 for a malformed body or user id; 503 when the store's writer lease
stayed busy (retry later). Every `append_compact_every` batches the tables appends write are
compacted in the background (`memory.ingest.append.Compactor`), so reads stay fast under a stream.
"""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from memory.errors import AppendTooLargeError
from memory.ingest import append
from memory.ingest.append import Compactor
from retrieval.guard import allow_body
from retrieval.retriever import Retriever

#: the paths of the append route (their own, larger, body limit)
APPEND_PATHS = r"/v1/users/[^/]+/messages"


class AppendRequest(BaseModel):
    messages: list[Any] = Field(..., min_length=1, description="turns: objects with session_id, message_id, "
                                "speaker (or role), text and an ISO 8601 timestamp; bad ones are quarantined")


def register(app: FastAPI, retriever: Retriever) -> None:
    """Add the append route (and its body limit) to the service app."""
    settings = retriever.settings
    allow_body(app, APPEND_PATHS, settings.append_max_bytes)
    compactor = Compactor(retriever.store, settings.append_compact_every)

    @app.exception_handler(AppendTooLargeError)
    async def too_large(_: Request, exc: AppendTooLargeError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=413)

    @app.post("/v1/users/{user_id}/messages")
    def append_messages(user_id: str, body: AppendRequest) -> dict[str, Any]:
        """Append a batch of the user's turns: counts, and the quarantined turns with their reasons."""
        report = append(retriever.store, user_id, body.messages, max_messages=settings.append_max_messages)
        if report.added:
            compactor.appended()
        return report.to_dict()
