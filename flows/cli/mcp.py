"""`mnemo mcp`: the memory tools (search, context, append, feedback) as an MCP server over the store
(`flows.mcp`): stdio for a local assistant, or streamable HTTP behind MNEMO_API_KEY."""
from __future__ import annotations

from typing import Optional

import typer

from flows.cli.context import settings_of
from memory.errors import ConfigError

TRANSPORTS = ("stdio", "http")


def mcp(
    ctx: typer.Context,
    transport: str = typer.Option("stdio", "--transport", help="stdio | http (streamable HTTP at /mcp)"),
    host: Optional[str] = typer.Option(None, "--host", help="bind address for http [default: "
                                       "MNEMO_RETRIEVAL_HOST, 127.0.0.1]"),
    port: Optional[int] = typer.Option(None, "--port", min=1, max=65535, help="port for http [default 8766]"),
) -> None:
    """Serve the memory as MCP tools, each scoped to the user id it is given."""
    from flows.cli.retrieve import open_retriever
    from flows.mcp import run
    from flows.service import configure_writes

    if transport not in TRANSPORTS:
        raise ConfigError(f"unknown transport {transport!r} (known: {', '.join(TRANSPORTS)})")
    settings = settings_of(ctx)
    r = open_retriever(settings, serving=True)
    configure_writes(r, settings)   # a refused append waits write_wait_s, not the library's 30 s
    run(r, "http" if transport == "http" else "stdio", host or settings.retrieval.host, port or 8766)


def register(app: typer.Typer) -> None:
    """Add `mcp` to the app."""
    app.command("mcp")(mcp)
