"""`mnemo forget USER`: delete a user's messages (named ones, sessions, those before a date, or all of
them) and everything derived from them, re-derive what survives and purge the old versions."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Optional

import typer

from flows.cli.context import existing_store, settings_of
from memory.errors import ConfigError


def parse_when(value: str | None) -> datetime | None:
    """An ISO 8601 date or time; one without a zone is taken as UTC."""
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--before {value!r} is not an ISO 8601 date or time (e.g. 2024-03-01)") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def forget(
    ctx: typer.Context,
    user: str = typer.Argument(..., help="the user whose memory goes (all of it when no scope is given)"),
    session: Optional[list[str]] = typer.Option(None, "--session", help="forget this session (repeatable)"),
    message: Optional[list[str]] = typer.Option(None, "--message", help="forget this message id (repeatable)"),
    before: Optional[str] = typer.Option(None, "--before", help="forget the messages before this date (UTC "
                                         "unless it names a zone)"),
    keep_versions: bool = typer.Option(False, "--keep-versions", help="skip the purge of old table versions "
                                       "(time travel kept; the forgotten text stays in them)"),
    as_json: bool = typer.Option(False, "--json", help="the report as JSON"),
) -> None:
    """Forget messages and everything derived from them, down to the bytes on disk. Waits for a
    consolidation still running (MNEMO_RUN_LEASE_WAIT_S), else exits 75."""
    from memory.forget import forget as do_forget
    from memory.runs import open_store

    settings = existing_store(settings_of(ctx))   # a mistyped --store must not report '0 forgotten'
    report = do_forget(open_store(settings), settings, user, sessions=session or [], messages=message or [],
                       before=parse_when(before), keep_versions=keep_versions)
    typer.echo(json.dumps(report.to_dict(), indent=2, default=str) if as_json else report.summary())


def register(app: typer.Typer) -> None:
    """Add `forget` to the app."""
    app.command()(forget)
