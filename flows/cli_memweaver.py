"""`mnemo profile USER` and `mnemo graph USER --html FILE`: seeing MemWeaver's memory of a user.

Added to the `mnemo` app by `register(app, bench_app)` (flows/cli.py, COMMAND_MODULES); the store is
the global `--store` option (`ctx.obj["settings"]`).
"""
from __future__ import annotations

import typer


def _store(ctx: typer.Context):  # type: ignore[no-untyped-def]
    from memory.runs import open_store

    return open_store(ctx.obj["settings"])


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add `profile` and `graph` to the `mnemo` app."""

    @app.command()
    def profile(ctx: typer.Context, user: str = typer.Argument(..., help="user id")) -> None:
        """Print a user's global profile and its phases with their date ranges."""
        from memory.ids import validate_user_id
        from memory.summarize import read_profile

        prof, phases = read_profile(_store(ctx), validate_user_id(user))
        if prof is None and not phases:
            typer.echo(f"no profile for user {user!r}: consolidate its sessions first")
            raise typer.Exit(1)
        if prof is not None:
            typer.echo(f"Profile of {user} ({prof['date']}, from {len(phases)} phases):")
            typer.echo(prof["content"])
        typer.echo(f"\nPhases ({len(phases)}):")
        for i, p in enumerate(phases, 1):
            typer.echo(f"{i:>3}. {p['date']:<24} {p['n_items']:>3} fragments  {' '.join(p['content'].split())}")

    @app.command()
    def graph(
        ctx: typer.Context,
        user: str = typer.Argument(..., help="user id"),
        html: str = typer.Option(..., "--html", help="write the interactive page to this file"),
    ) -> None:
        """Write one self-contained interactive HTML page of a user's memory graph (works offline)."""
        from memory.graph_html import write_html
        from memory.ids import validate_user_id

        drawn = write_html(_store(ctx), validate_user_id(user), html)
        if drawn["nodes"] == 0:
            typer.echo(f"user {user!r} has no graph yet: consolidate its sessions first", err=True)
        typer.echo(f"wrote {html}: {drawn['nodes']} nodes, {drawn['edges']} temporal edges, "
                   f"{drawn['clusters']} clusters, {drawn['phases']} phases")

    @bench_app.command("incremental")
    def bench_incremental(path: str = typer.Argument(..., help="LoCoMo JSON file"),
                          strategies: str = typer.Option("walk,hybrid-walk,rfmem-hybrid", "--strategies")) -> None:
        """Consolidate in two batches and compare Recall@10 with a rebuild of the same store."""
        from retrieval.bench_incremental import bench_incremental as run

        typer.echo(run(path, [s.strip() for s in strategies.split(",") if s.strip()]))
