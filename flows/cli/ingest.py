"""`mnemo ingest`: validate an archive and load it into the store."""
from __future__ import annotations

from typing import NoReturn, Optional

import typer
from rich.markup import escape

from flows.cli.context import EXIT_FAILED, console, settings_of


def ingest(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="archive file (beam: a chat.json or a folder of SCALE/N/chat.json)"),
    fmt: str = typer.Option(..., "--format", "-f", help="locomo | longmemeval | jsonl | parquet | beam"),
    observations_as_fragments: bool = typer.Option(False, "--observations-as-fragments",
                                                   help="LoCoMo: import recorded observations as fragments"),
    user: Optional[str] = typer.Option(None, "--user", help="beam: the user id of a single chat "
                                       "(default beam-<SCALE>-<N> from its folders)"),
) -> None:
    """Validate and load an archive into the store; bad rows are quarantined with their reason. Exit 1
    when no row could be read at all (every one quarantined): most often the wrong --format."""
    import time

    from memory.ingest import ingest_batch, read_archive
    from memory.runs import open_store

    start = time.perf_counter()
    batch = read_archive(path, fmt, observations_as_fragments=observations_as_fragments, user_id=user)
    report = ingest_batch(open_store(settings_of(ctx)), batch, start=start)   # read first: a bad archive makes no store
    typer.echo(report.summary())
    if batch.messages.is_empty() and report.quarantined:
        unreadable(path, fmt)


def unreadable(path: str, fmt: str) -> NoReturn:
    """Say that no message of the archive could be read, and exit 1 (`ingest`, `backfill`)."""
    console.print(f"[red]no message of {escape(path)} could be read as {escape(fmt)}[/]: is --format right? The rows are kept "
                  "in the quarantine table with their reasons", soft_wrap=True)
    raise typer.Exit(EXIT_FAILED)


def register(app: typer.Typer) -> None:
    """Add `ingest` to the app."""
    app.command()(ingest)
