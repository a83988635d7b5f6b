"""The `mnemo` command line, one module per thing a user does:

- `ingest`: `mnemo ingest`
- `consolidate`: `mnemo consolidate`, `mnemo backfill`
- `inspect`: `mnemo stats`, `mnemo profile`, `mnemo graph`, `mnemo doctor`
- `forget`: `mnemo forget`
- `retrieve`: `mnemo retrieve`, `mnemo serve`, `mnemo train-reranker`
- `mcp`: `mnemo mcp` (the memory tools over MCP)
- `bench`: every `mnemo bench ...`

The root callback reads the settings once (`load_settings`: MNEMO_* variables, then the global
--store) into `ctx.obj`; commands apply their flags on top and pass the Settings down. Bad input
(any `MnemoError`, an invalid setting) ends in one line on stderr and exit code 2, never a traceback;
a consolidation skipped because another run still holds the store's run lease exits 75.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Any, NoReturn, Optional

import typer
from pydantic import ValidationError
from pydantic_settings import SettingsError
from rich.markup import escape
from typer.core import TyperGroup

from flows.cli import bench, consolidate, forget, ingest, inspect, mcp, retrieve
from flows.cli.context import EXIT_BUSY, EXIT_FAILED, console
from memory.errors import ConfigError, LLMError, MnemoError, ReplayMissError, RunInProgressError, StoreBusyError
from memory.settings import closest_variable, load_settings

__all__ = ["app", "bench_app", "main"]


def _fail(message: str) -> NoReturn:
    console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    raise typer.Exit(2)


def _invalid(exc: ValidationError) -> str:
    """One line for settings the environment got wrong: the first error, named by its variable."""
    first = exc.errors()[0]
    loc = [str(p) for p in first["loc"]]
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    name = f"MNEMO_{'_'.join(loc).upper()}"
    hint = f" (did you mean {close}?)" if first["type"] == "extra_forbidden" and (close := closest_variable(name)) else ""
    return f"invalid setting {'.'.join(loc)} ({name}): {first['msg']}{hint}{more}"


class MnemoGroup(TyperGroup):
    """The root command group: a `MnemoError` prints one line and exits 2 (75 for a run skipped
    because another still runs, or a write that waited too long for another writer: try again; 1 for
    a run the LLM backend failed)."""

    def invoke(self, ctx: Any) -> Any:  # a click Context (typer's vendored click)
        try:
            return super().invoke(ctx)
        except (RunInProgressError, StoreBusyError) as exc:
            console.print(f"[yellow]{escape(str(exc))}[/yellow]", soft_wrap=True)
            raise typer.Exit(EXIT_BUSY) from None
        except LLMError as exc:
            if isinstance(exc, ReplayMissError):   # a recording that lacks an answer: the input's fault
                _fail(str(exc))
            console.print(f"[red]failed:[/red] {escape(str(exc))}", soft_wrap=True)   # the server, not the input
            raise typer.Exit(EXIT_FAILED) from None
        except MnemoError as exc:
            _fail(str(exc))
        except ValidationError as exc:   # a flag's value out of its setting's range (--dask-local -1)
            _fail(_invalid(exc).replace("invalid setting", "invalid value for setting", 1))
        except typer.BadParameter as exc:   # a flag's or argument's value, or a missing argument: one line too
            where = exc.ctx.command_path if exc.ctx is not None else "mnemo"
            _fail(f"{exc.format_message()} (see `{where} --help`)")


#: help is plain text (rich_markup_mode=None): with rich markup on, a note in brackets such as
#: "[env MNEMO_STORE, default ./memstore]" would be read as a markup tag and vanish from --help
app = typer.Typer(cls=MnemoGroup, help="mnemo: long-term memory for LLM assistants.", no_args_is_help=True,
                  pretty_exceptions_enable=False, rich_markup_mode=None)
bench_app = typer.Typer(help="Benchmarks that print figures.", no_args_is_help=True, rich_markup_mode=None)


@app.callback()
def main_options(
    ctx: typer.Context,
    store: Optional[str] = typer.Option(None, "--store", help="LanceDB directory or URI [env MNEMO_STORE, default ./memstore]"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="debug logging"),
) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for noisy in ("httpx", "sentence_transformers", "transformers", "distributed", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        ctx.obj = load_settings(store=store)
    except ValidationError as exc:
        raise ConfigError(_invalid(exc)) from None
    except SettingsError as exc:   # a list or dict setting whose value is not JSON
        raise ConfigError(f"{exc}; list and dict settings take JSON, e.g. MNEMO_RETRIEVAL_KINDS='[\"message\"]'") from None


ingest.register(app)
forget.register(app)
consolidate.register(app)
inspect.register(app)
retrieve.register(app)
mcp.register(app)
bench.register(bench_app)
app.add_typer(bench_app, name="bench")


def main() -> None:
    """Console-script entry point (`mnemo`)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    app()
