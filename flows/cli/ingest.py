"""`mnemo ingest`: validate an archive and load it into the store."""
from __future__ import annotations

import typer

from flows.cli.context import settings_of


def ingest(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="archive file"),
    fmt: str = typer.Option(..., "--format", "-f", help="locomo | longmemeval | jsonl | parquet"),
    observations_as_fragments: bool = typer.Option(False, "--observations-as-fragments",
                                                   help="LoCoMo: import recorded observations as fragments"),
) -> None:
    """Validate and load an archive into the store; bad rows are quarantined with their reason."""
    from memory.ingest import ingest as do_ingest
    from memory.runs import open_store

    report = do_ingest(open_store(settings_of(ctx)), path, fmt, observations_as_fragments=observations_as_fragments)
    typer.echo(report.summary())


def register(app: typer.Typer) -> None:
    """Add `ingest` to the app."""
    app.command()(ingest)
