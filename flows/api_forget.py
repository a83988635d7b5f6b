"""`DELETE /v1/users/{user_id}` and `POST /v1/users/{user_id}/forget`: forget a whole user, or some
of its sessions / messages / messages before a time, and everything derived from them
(`memory.forget`). Same auth as every route (`retrieval.guard`). Answers 200 with the report (counts
per table, LLM calls, bytes reclaimed; forgetting what does not exist reports zero), 409 while a
consolidation holds the store's run lease (after `run_lease_wait_s`), 422 for a bad body or user id:
a field it does not know (a misspelled `sessions` must not read as "nothing named", which is the
whole user), or a POST naming nothing (the whole user is `DELETE`). The service's index of the user
is dropped at once, so the forgotten texts leave its memory too.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, Optional

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

from memory.errors import ConfigError
from memory.forget import forget
from memory.settings import Settings
from retrieval.retriever import Retriever


class ForgetRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sessions: list[str] = Field(default_factory=list, description="session ids to forget")
    messages: list[str] = Field(default_factory=list, description="message ids to forget")
    before: Optional[datetime] = Field(None, description="forget the messages before this time (ISO 8601 "
                                       "with a zone)")
    keep_versions: bool = Field(False, description="skip the purge of old table versions")


def register(app: FastAPI, retriever: Retriever, settings: Settings | None = None) -> None:
    """Add the forget routes to the service app; `settings`: the store's full settings (the embedder and
    LLM backend the re-derivation uses, the leases); without them the defaults for the retriever's
    store (pass them when the store was consolidated with another embedder or LLM)."""

    def full() -> Settings:
        return settings or Settings(store=retriever.store.uri, retrieval=retriever.settings)

    def run(user_id: str, **scope: Any) -> dict[str, Any]:
        """The forget, then the user's cached index dropped (whatever the forget did before failing)."""
        try:
            return forget(retriever.store, full(), user_id, **scope).to_dict()
        finally:
            retriever.cache.evict(user_id)

    @app.delete("/v1/users/{user_id}")
    def forget_user(user_id: str) -> dict[str, Any]:
        """Forget the whole user: every message and everything derived from it."""
        return run(user_id)

    @app.post("/v1/users/{user_id}/forget")
    def forget_some(user_id: str, body: ForgetRequest) -> dict[str, Any]:
        """Forget some of the user's sessions / messages / messages before a time."""
        if not (body.sessions or body.messages or body.before is not None):
            raise ConfigError("the body names no sessions, messages or time (`before`); to forget the "
                              f"whole user send DELETE /v1/users/{user_id}")
        return run(user_id, sessions=body.sessions, messages=body.messages, before=body.before,
                   keep_versions=body.keep_versions)
