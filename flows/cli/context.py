"""What every `mnemo` command shares: the Settings the root callback read, the stderr console,
comma-separated lists."""
from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from memory.errors import ConfigError
from memory.schemas import SCHEMAS
from memory.settings import Settings

#: progress bars and errors go to stderr, results to stdout
console = Console(stderr=True)

#: exit codes a scheduler can tell apart: a failed run (the LLM backend failed it); bad input or configuration; a run that finished but set LLM
#: work aside (quarantined, retried next run, or given up after `max_llm_attempts`); a run skipped
#: because another run still holds the store's run lease (EX_TEMPFAIL: "skipped, still running")
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_QUARANTINED = 3
EXIT_BUSY = 75


def finish_run(status: str) -> None:
    """End a consolidation command with the exit code its run status calls for."""
    if status == "quarantined":
        console.print("[yellow]some LLM work was quarantined: see the summary; it is retried next run[/]")
        raise typer.Exit(EXIT_QUARANTINED)


def settings_of(ctx: typer.Context) -> Settings:
    """The Settings the root callback read from the environment and the global --store (`ctx.obj`)."""
    found = ctx.find_object(Settings)
    if found is None:
        raise ConfigError("no settings in the command context: run commands through the `mnemo` app")
    return found


def existing_store(settings: Settings) -> Settings:
    """`settings`, when their store exists (a local path holding mnemo tables; a URI is taken as given):
    a nightly job whose --store or MNEMO_STORE is mistyped must fail, not make an empty store and
    succeed every night, nor forget "0 messages" of a folder that holds none."""
    uri = settings.store
    if not store_exists(uri):
        what = " (the folder holds no mnemo tables)" if Path(uri).exists() else ""
        raise ConfigError(f"no store at {uri}{what}: `mnemo ingest` or `mnemo backfill` makes one; check --store / "
                          "MNEMO_STORE", store=uri)
    return settings


def store_exists(uri: str) -> bool:
    """Whether a store may be at `uri`: any URI (taken as given), or a local folder holding at least one
    mnemo table (`<table>.lance`, `memory.schemas.SCHEMAS`); an empty or unrelated folder is no store."""
    if "://" in uri:
        return True
    root = Path(uri)
    return root.is_dir() and any((root / f"{name}.lance").is_dir() for name in SCHEMAS)


def csv(value: str | None) -> list[str]:
    """The non-empty, stripped items of a comma-separated flag value."""
    return [v.strip() for v in value.split(",") if v.strip()] if value else []
