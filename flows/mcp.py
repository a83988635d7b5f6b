"""`mnemo mcp`: the memory as an MCP server (the official `mcp` Python SDK, `MCPServer`).

Four tools, each taking the `user_id` it acts for and touching only that user's rows (every call
goes through `Retriever` / `memory.ingest.append`, which validate the id and scope every read):

- `search_memory(user_id, query, k, strategy)`: ranked memories with their ids, kinds, dates, scores
  and source message ids;
- `get_context(user_id, query, k, max_tokens)`: the prompt-ready context (profile first, then the
  retrieved memories, chronological and dated, within the token budget) and the ids it shows;
- `append_messages(user_id, messages)`: a batch of turns, validated like an ingest (bad ones are
  quarantined and listed); the next consolidation makes them memory;
- `give_feedback(user_id, query, shown_ids, cited_ids)`: what the answering LLM was shown and
  cited (RMM), for the nightly reranker.

Transports: stdio (a local assistant spawns `mnemo mcp`), or streamable HTTP (`--transport http`,
path `/mcp`) behind the service's bearer key (`RetrievalSettings.api_key`, MNEMO_API_KEY) and a
body limit, both enforced by `retrieval.guard.RequestGuard` before any body is read. A bad argument
(unknown user id format, blank query, unknown strategy, oversize batch) is a tool error with the
`MnemoError`'s message.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any, Iterator, Literal, Optional

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from starlette.types import ASGIApp

from memory.embed import single_threaded
from memory.errors import ConfigError, MnemoError
from memory.ingest.append import Compactor
from retrieval.guard import RequestGuard, open_without_key
from retrieval.retriever import Retriever

#: where the streamable HTTP transport listens
MCP_PATH = "/mcp"

INSTRUCTIONS = ("Long-term memory of the user's past conversations. Call get_context (or search_memory) with the "
                "user's id and the current question before answering; append_messages with the turns of this "
                "conversation; give_feedback with the memory ids you were shown and those you used.")


@contextmanager
def as_tool_error() -> Iterator[None]:
    """A `MnemoError` becomes a tool error carrying its message (the SDK reports any other exception
    as "Error executing tool", without the reason the model needs to correct its call or retry)."""
    try:
        yield
    except MnemoError as exc:
        raise ToolError(str(exc)) from exc


def build_server(retriever: Retriever) -> MCPServer:
    """The MCP server exposing the four memory tools over one retriever (and its store)."""
    settings = retriever.settings
    server: MCPServer = MCPServer(name="mnemo", instructions=INSTRUCTIONS, version="0.1.0")
    compactor = Compactor(retriever.store, settings.append_compact_every)

    def check_query(query: str) -> None:
        if len(query) > settings.max_query_chars:
            raise ConfigError(f"query longer than {settings.max_query_chars} characters")

    @server.tool()
    def search_memory(user_id: str, query: str, k: Optional[int] = None,
                      strategy: Optional[str] = None) -> dict[str, Any]:
        """Search one user's long-term memory: ranked memories (id, kind, text, date, score,
        source message ids) for a query. `strategy` defaults to the service's best."""
        with as_tool_error():
            check_query(query)
            res = retriever.retrieve(user_id, query, k=k, strategy=strategy)
        return {"user_id": res.user_id, "strategy": res.strategy, "route": res.route,
                "items": [it.to_dict() for it in res.items]}

    @server.tool()
    def get_context(user_id: str, query: str, k: Optional[int] = None,
                    max_tokens: Optional[int] = None) -> dict[str, Any]:
        """Prompt-ready context from one user's memory for a query: the user's profile, then the
        retrieved memories in time order with their dates, within `max_tokens`; and the ids shown."""
        with as_tool_error():
            check_query(query)
            res = retriever.retrieve(user_id, query, k=k)
            text, shown = res.context_shown(max_tokens)
        return {"user_id": res.user_id, "context": text, "item_ids": shown}

    @server.tool()
    def append_messages(user_id: str, messages: list[Any]) -> dict[str, Any]:
        """Append turns of one user's conversation: objects with session_id, message_id, speaker (or
        role), text and an ISO 8601 timestamp. Bad turns are quarantined and listed with their index
        and reason; re-sending a turn adds nothing. The next consolidation run makes them memory."""
        with as_tool_error():
            return compactor.append(user_id, messages, max_messages=settings.append_max_messages).to_dict()

    @server.tool()
    def give_feedback(user_id: str, query: str, shown_ids: list[str],
                      cited_ids: Optional[list[str]] = None) -> dict[str, Any]:
        """Record which of the memory ids shown for a query the answer cited (trains the reranker)."""
        with as_tool_error():
            check_query(query)
            return retriever.feedback(user_id, query, shown_ids, cited_ids or [])

    return server


def http_app(retriever: Retriever, host: str = "127.0.0.1") -> ASGIApp:
    """The streamable HTTP app at `MCP_PATH`, behind the bearer key and a body limit."""
    settings = retriever.settings
    app = build_server(retriever).streamable_http_app(streamable_http_path=MCP_PATH, host=host,
                                                      max_request_body_size=settings.append_max_bytes)
    key = settings.api_key.get_secret_value() if settings.api_key is not None else None
    return RequestGuard(app, api_key=key, max_body=settings.append_max_bytes, public_paths=frozenset())


def run(retriever: Retriever, transport: Literal["stdio", "http"] = "stdio", host: str = "127.0.0.1",
        port: int = 8766) -> None:
    """Serve the tools over stdio (until the client closes it) or streamable HTTP (until interrupted),
    BLAS, torch and ONNX Runtime single-threaded as `mnemo serve` (tool calls run in parallel threads)."""
    single_threaded()
    if transport == "stdio":
        build_server(retriever).run("stdio")
        return
    from flows.service import run_server

    warning = open_without_key(host, retriever.settings.api_key is not None)
    if warning:
        logging.getLogger(__name__).warning(warning)
    run_server(http_app(retriever, host), host, port, "mcp --host / --port")
