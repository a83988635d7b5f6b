"""`mnemo stats`, `mnemo profile USER`, `mnemo graph USER --html FILE` and `mnemo doctor [--fix]`:
looking at what the store holds (counts per user and kind, MemWeaver's profile and phases, the memory
graph) and checking it (duplicate ids, missing sources, session rows, unfinished forgets, dangling
validity: `memory.doctor`)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from flows.cli.context import existing_store, settings_of
from memory.errors import ConfigError


def stats(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="machine-readable counts")) -> None:
    """Counts per user and memory kind."""
    from memory.read import stats as store_stats
    from memory.runs import open_store

    settings = existing_store(settings_of(ctx))
    data = store_stats(open_store(settings))
    if as_json:
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    users = data["users"]
    kinds = sorted({k for row in users.values() for k in row})
    table = Table("user", *kinds, title=f"store {settings.store}")
    for user, row in users.items():
        table.add_row(user, *(str(row.get(k, 0)) for k in kinds))
    # piped, rich would fit the table into 80 columns and cut every header; a table takes only the width it needs
    Console(width=None if sys.stdout.isatty() else 10_000).print(table)
    typer.echo(f"{len(users)} users")


def profile(ctx: typer.Context, user: str = typer.Argument(..., help="user id")) -> None:
    """Print a user's global profile and its phases with their date ranges."""
    from memory.ids import validate_user_id
    from memory.read import read_profile
    from memory.runs import open_store

    user = validate_user_id(user)
    prof, phases = read_profile(open_store(existing_store(settings_of(ctx))), user)
    if prof is None and not phases:
        typer.echo(f"no profile for user {user!r}: consolidate its sessions first")
        raise typer.Exit(1)
    if prof is not None:
        typer.echo(f"Profile of {user} ({prof['date']}, from {len(phases)} phases):")
        typer.echo(prof["content"])
    typer.echo(f"\nPhases ({len(phases)}):")
    for i, p in enumerate(phases, 1):
        typer.echo(f"{i:>3}. {p['date']:<24} {p['n_items']:>3} fragments  {' '.join(p['content'].split())}")


def graph(
    ctx: typer.Context,
    user: str = typer.Argument(..., help="user id"),
    html: str = typer.Option(..., "--html", help="write the interactive page to this file"),
) -> None:
    """Write one self-contained interactive HTML page of a user's memory graph (works offline)."""
    from memory.graph_html import write_html
    from memory.ids import validate_user_id
    from memory.runs import open_store

    user = validate_user_id(user)
    store = open_store(existing_store(settings_of(ctx)))
    if not store.read("messages", user, columns=["id"], limit=1).num_rows:   # a mistyped id: no empty page, exit 0
        raise ConfigError(f"the store holds no messages of user {user!r}: `mnemo stats` lists its users", user=user)
    Path(html).parent.mkdir(parents=True, exist_ok=True)
    drawn = write_html(store, user, html)
    if drawn["nodes"] == 0:
        typer.echo(f"user {user!r} has no graph yet: consolidate its sessions first", err=True)
    typer.echo(f"wrote {html}: {drawn['nodes']} nodes, {drawn['edges']} temporal edges, "
               f"{drawn['clusters']} clusters, {drawn['phases']} phases")


def doctor(
    ctx: typer.Context,
    fix: bool = typer.Option(False, "--fix", help="remove duplicate rows (one copy of each id kept), store the "
                             "BM25 terms of rows an older mnemo wrote, remake session rows from their messages "
                             "and clear validity pointers naming a row stored nowhere, then compact the tables "
                             "it rewrote"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable report"),
) -> None:
    """Report duplicate ids per table, rows whose source messages are missing, rows without stored BM25
    terms, session rows disagreeing with their messages, forget runs left unfinished (`mnemo forget
    USER` finishes them) and validity naming a row stored nowhere. Exit 1 when a problem remains: after
    --fix, missing sources and unfinished forgets still do (rows without terms are no problem, only
    slower)."""
    from memory.doctor import check
    from memory.runs import open_store

    settings = existing_store(settings_of(ctx))
    report = check(open_store(settings), fix=fix, cleanup_older_than_s=settings.cleanup_older_than_s)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2, sort_keys=True))
    else:
        for line in report.lines():
            typer.echo(line)
        if report.duplicates and not fix:
            typer.echo("run `mnemo doctor --fix` to remove the duplicates")
    if not report.ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `stats`, `profile`, `graph` and `doctor` to the app."""
    app.command()(stats)
    app.command()(profile)
    app.command()(graph)
    app.command()(doctor)
