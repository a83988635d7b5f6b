"""The `mnemo` command line (flows/cli/): every command registered, bad input ends in one line and
exit code 2 (never a traceback), and flags override the environment in the Settings a command
hands down."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from flows.cli import app
from memory.settings import Settings
from memory.store import Store
from tests.helpers import REPO, SAMPLE

#: every command `mnemo` must offer (README, "Commands"), and every `mnemo bench` subcommand
COMMANDS = {"ingest", "consolidate", "backfill", "stats", "profile", "graph", "doctor", "retrieve", "serve",
            "train-reranker", "bench", "forget", "mcp"}
BENCHES = {"beam", "beam-anchors", "consolidate", "locomo", "retrieval", "incremental", "rerank", "forget", "llm",
           "updates", "appends"}


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def test_every_command_is_registered_and_in_the_help() -> None:
    root = typer.main.get_command(app)
    assert set(root.commands) == COMMANDS  # type: ignore[attr-defined]
    assert set(root.commands["bench"].commands) == BENCHES  # type: ignore[attr-defined]
    out = invoke("--help")
    assert out.exit_code == 0, out.output
    for name in COMMANDS:
        assert f" {name} " in out.output, name
    bench = invoke("bench", "--help")
    assert bench.exit_code == 0, bench.output
    for name in BENCHES:
        assert f" {name} " in bench.output, name


def test_a_missing_command_module_is_an_import_error() -> None:
    """Registration is explicit: without one of its modules the CLI does not load at all."""
    code = "import sys; sys.modules['flows.cli.inspect'] = None; import flows.cli"
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert "ImportError" in res.stderr or "ModuleNotFoundError" in res.stderr


@pytest.mark.parametrize("args, message", [
    (("ingest", "{tmp}/missing.json", "--format", "locomo"), "archive not found"),
    (("ingest", str(SAMPLE), "--format", "nope"), "unknown archive format 'nope'"),
    (("profile", "bad id!"), "invalid user id"),
    (("profile", "alice\n"), "invalid user id"),
    (("retrieve", "alice\n", "my dog"), "invalid user id"),
    (("graph", "../etc", "--html", "{tmp}/g.html"), "invalid user id"),
    (("retrieve", "alice", "my dog"), "no store at {tmp}/store"),   # not "0 items" on a mistyped path
    (("consolidate", "--engine", "nope"), "unknown engine 'nope'"),
    (("bench", "locomo", "{tmp}/missing.json", "--extraction", "nope"), "unknown extraction 'nope'"),
    (("bench", "beam-anchors", "{tmp}"), "holds no SCALE/N/chat.json folder"),
    (("consolidate", "--dask-local", "-1"), "invalid value for setting dask_local (MNEMO_DASK_LOCAL)"),
    (("train-reranker", "--scope", "bogus"), "unknown reranker scope 'bogus'"),
    (("consolidate",), "no store at {tmp}/store: `mnemo ingest` or `mnemo backfill` makes one"),
    (("forget", "alice"), "no store at {tmp}/store"),       # an erasure on a mistyped path is no success
    (("doctor",), "no store at {tmp}/store"),
    (("stats",), "no store at {tmp}/store"),
    (("profile", "alice"), "no store at {tmp}/store"),
    (("train-reranker",), "no store at {tmp}/store"),
])
def test_bad_input_ends_in_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    out = invoke("--store", str(tmp_path / "store"), *(a.format(tmp=tmp_path) for a in args))
    assert out.exit_code == 2, out.output
    assert isinstance(out.exception, SystemExit)
    assert out.stderr.startswith("error: ") and message.format(tmp=tmp_path) in out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.output
    if args[0] in ("consolidate", "ingest", "forget", "doctor", "stats", "profile", "retrieve", "train-reranker"):
        assert not (tmp_path / "store").exists()             # nothing made for a mistyped store or archive


def test_an_unknown_strategy_on_a_store_is_exit_2(tmp_path: Path) -> None:
    Store(str(tmp_path / "store")).table("messages")     # a store: a folder holding a mnemo table
    out = invoke("--store", str(tmp_path / "store"), "retrieve", "alice", "my dog", "--strategy", "nope")
    assert out.exit_code == 2 and "unknown retrieval strategy: 'nope'" in out.stderr, out.output


@pytest.mark.parametrize("variable, value, where", [("MNEMO_THETA", "abc", "theta"),
                                                    ("MNEMO_RETRIEVAL_K", "0", "retrieval.k")])
def test_a_bad_environment_value_is_one_line_too(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                 variable: str, value: str, where: str) -> None:
    monkeypatch.setenv(variable, value)
    out = invoke("--store", str(tmp_path / "store"), "stats", "--json")
    assert out.exit_code == 2, out.output
    assert out.stderr.startswith(f"error: invalid setting {where} ({variable}): ") and out.stderr.count("\n") == 1


def test_a_list_setting_that_is_not_json_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MNEMO_RETRIEVAL_KINDS", "message,fragment")
    out = invoke("--store", str(tmp_path / "store"), "stats", "--json")
    assert out.exit_code == 2 and "list and dict settings take JSON" in out.stderr and "Traceback" not in out.output


@pytest.mark.parametrize("args", [("bench", "locomo", "{tmp}/x.json", "--k", "five"),
                                  ("retrieve", "alice", "my dog", "--k", "0"),
                                  ("train-reranker", "--epochs", "0")])
def test_a_bad_flag_value_is_a_usage_error(tmp_path: Path, args: tuple[str, ...]) -> None:
    out = invoke("--store", str(tmp_path / "store"), *(a.format(tmp=tmp_path) for a in args))
    assert out.exit_code == 2 and ("--k" in out.output or "--epochs" in out.output) and "Traceback" not in out.output


def test_graph_html_makes_its_folder(sample_store: Any, tmp_path: Path) -> None:
    out = invoke("--store", sample_store.uri, "graph", "alice", "--html", str(tmp_path / "new" / "dir" / "g.html"))
    assert out.exit_code == 0, out.output
    assert (tmp_path / "new" / "dir" / "g.html").stat().st_size > 0


@pytest.fixture
def flows_seen(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Settings, dict[str, Any]]]:
    """`run_flow` replaced by a recorder of what the CLI hands it."""
    import flows.consolidate

    seen: list[tuple[str, Settings, dict[str, Any]]] = []

    def run_flow(name: str, settings: Settings, **params: Any) -> dict[str, Any]:
        seen.append((name, settings, params))
        status = "quarantined" if settings.llm == "quarantining" else "completed"
        return {"summary": f"{name} summary", "ingest": "ingest summary", "status": status}

    monkeypatch.setattr(flows.consolidate, "run_flow", run_flow)
    return seen


def test_consolidate_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                    flows_seen: list[tuple[str, Settings, dict[str, Any]]]) -> None:
    monkeypatch.setenv("MNEMO_THETA", "0.7")
    monkeypatch.setenv("MNEMO_LLM", "openai")
    monkeypatch.setenv("MNEMO_STORE", str(tmp_path / "from-env"))
    monkeypatch.setenv("MNEMO_RETRIEVAL_K", "7")
    store = str(tmp_path / "from-flag")
    Store(store).table("runs")                                            # a store (an empty folder is none)
    out = invoke("--store", store, "consolidate", "--llm", "replay", "--users", "b, a,", "--rebuild-graph",
                 "--dask-local", "3")
    assert out.exit_code == 0, out.output
    assert out.stdout == "consolidate summary\n"
    [(name, settings, params)] = flows_seen
    assert name == "consolidate" and params == {"users": ["b", "a"]}
    assert isinstance(settings, Settings)
    assert settings.theta == 0.7 and settings.retrieval.k == 7           # the environment reaches the flow
    assert settings.llm == "replay" and settings.store == store          # flags win over it
    assert settings.rebuild_graph is True and settings.dask_local == 3
    assert Settings().theta == 0.6                                       # defaults never read it


def test_a_run_the_llm_server_fails_exits_1(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Connection refused: the run failed (1), not bad input (2); the reason in one line."""
    monkeypatch.setenv("MNEMO_LLM_BASE_URL", "http://127.0.0.1:1/v1")
    monkeypatch.setenv("MNEMO_LLM_MAX_RETRIES", "0")
    store = str(tmp_path / "store")
    assert invoke("--store", store, "ingest", str(SAMPLE), "--format", "jsonl").exit_code == 0
    out = invoke("--store", store, "consolidate", "--engine", "local", "--llm", "openai", "--llm-model", "m")
    assert out.exit_code == 1, out.output
    assert "failed: " in out.stderr and "APIConnectionError" in out.stderr and "Traceback" not in out.output


def test_a_run_that_quarantined_work_exits_3(tmp_path: Path,
                                             flows_seen: list[tuple[str, Settings, dict[str, Any]]]) -> None:
    """A nightly cron tells "finished, but LLM work was set aside" (3) from success (0) and bad input (2)."""
    store = str(tmp_path / "store")
    assert invoke("--store", store, "ingest", str(SAMPLE), "--format", "jsonl").exit_code == 0  # work to do
    out = invoke("--store", store, "consolidate", "--llm", "quarantining")
    assert out.exit_code == 3, out.output
    assert out.stdout == "consolidate summary\n" and "quarantined" in out.stderr
    out = invoke("--store", store, "backfill", str(SAMPLE), "-f", "jsonl", "--llm", "quarantining")
    assert out.exit_code == 3, out.output


def test_backfill_hands_its_archive_and_settings_to_the_flow(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        flows_seen: list[tuple[str, Settings, dict[str, Any]]]) -> None:
    monkeypatch.setenv("MNEMO_LLM_MODEL", "env-model")
    monkeypatch.setenv("MNEMO_SHARD_SIZE", "3")
    out = invoke("--store", str(tmp_path / "store"), "backfill", str(SAMPLE), "-f", "jsonl",
                 "--llm-model", "flag-model")
    assert out.exit_code == 0, out.output
    assert out.stdout == "ingest summary\nbackfill summary\n"
    [(name, settings, params)] = flows_seen
    assert name == "backfill"
    assert params == {"path": str(SAMPLE), "fmt": "jsonl", "observations_as_fragments": False, "user_id": None}
    assert settings.llm_model == "flag-model" and settings.shard_size == 3


def test_commands_use_the_store_the_environment_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env_store = str(tmp_path / "env-store")
    none = invoke("--store", env_store, "stats", "--json")
    assert none.exit_code == 2 and "no store at" in none.stderr and not Path(env_store).exists()
    monkeypatch.setenv("MNEMO_STORE", env_store)
    ingested = invoke("ingest", str(SAMPLE), "--format", "jsonl")
    assert ingested.exit_code == 0, ingested.output
    assert "67 added" in ingested.stdout
    monkeypatch.setenv("MNEMO_STORE", str(tmp_path / "elsewhere"))
    counted = invoke("--store", env_store, "stats", "--json")
    assert counted.exit_code == 0, counted.output
    assert '"messages": ' in counted.stdout and len(json.loads(counted.stdout)["users"]) == 2


def test_serve_flags_override_the_retrieval_section(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import flows.cli.retrieve as cli_retrieve
    import flows.service

    opened: list[Settings] = []
    served: list[tuple[object, str, int]] = []

    def open_retriever(settings: Settings, *, serving: bool = False) -> object:
        assert serving            # a service may start on an empty store (appends fill it)
        opened.append(settings)
        return "retriever"

    monkeypatch.setattr(cli_retrieve, "open_retriever", open_retriever)
    monkeypatch.setattr(flows.service, "serve",
                        lambda r, host, port, settings=None: served.append((r, host, port)))
    monkeypatch.setenv("MNEMO_RETRIEVAL_HOST", "0.0.0.0")
    monkeypatch.setenv("MNEMO_RETRIEVAL_PORT", "9000")
    monkeypatch.setenv("MNEMO_RETRIEVAL_TAU", "0.5")
    out = invoke("--store", str(tmp_path / "store"), "serve", "--port", "9100")
    assert out.exit_code == 0, out.output
    assert served == [("retriever", "0.0.0.0", 9100)]
    [settings] = opened
    assert settings.retrieval.port == 9100 and settings.retrieval.tau == 0.5
    assert settings.store == str(tmp_path / "store")


def test_bench_gets_the_root_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import evaluation.locomo

    calls: list[dict[str, Any]] = []

    def bench_locomo(path: str, **kw: Any) -> str:
        calls.append(dict(kw, path=path))
        return "figures"

    monkeypatch.setattr(evaluation.locomo, "bench_locomo", bench_locomo)
    monkeypatch.setenv("MNEMO_RETRIEVAL_LEXICAL_WEIGHT", "0.4")
    out = invoke("bench", "locomo", "data.json", "--k", "1, 3", "--strategies", "dense,walk")
    assert out.exit_code == 0, out.output
    assert out.stdout == "figures\n"
    [kw] = calls
    assert kw["path"] == "data.json" and kw["ks"] == [1, 3] and kw["strategies"] == ["dense", "walk"]
    assert kw["extraction"] == "rules" and kw["store"] is None
    assert kw["settings"].retrieval.lexical_weight == 0.4


def test_bench_beam_anchors_passes_its_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    import evaluation.beam_anchors

    calls: list[dict[str, Any]] = []

    def bench_beam_anchors(path: str, **kw: Any) -> str:
        calls.append(dict(kw, path=path))
        return "anchors"

    monkeypatch.setattr(evaluation.beam_anchors, "bench_beam_anchors", bench_beam_anchors)
    out = invoke("bench", "beam-anchors", "beam", "--scales", "100K,500K", "--keep-markers")
    assert out.exit_code == 0, out.output
    assert out.stdout == "anchors\n"
    [kw] = calls
    assert kw["path"] == "beam" and kw["scales"] == ["100K", "500K"] and kw["keep_markers"] is True
    assert isinstance(kw["settings"], Settings)


def test_stats_piped_shows_every_column_whole(sample_store: Store) -> None:
    out = invoke("--store", sample_store.uri, "stats")               # CliRunner's stdout is no terminal
    assert out.exit_code == 0, out.output
    for name in ("graph_edges", "graph_nodes", "fragments", "summaries", "alice", "bob"):
        assert name in out.output, out.output
    assert "…" not in out.output


def test_a_mistyped_section_variable_names_the_setting_meant(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MNEMO_RETRIEVAL_RECAL_BOOST", "0.3")
    out = invoke("--store", str(tmp_path / "store"), "stats")
    assert out.exit_code == 2
    assert "MNEMO_RETRIEVAL_RECAL_BOOST" in out.output and "did you mean MNEMO_RETRIEVAL_RECALL_BOOST?" in out.output


@pytest.mark.parametrize("args, says", [
    (("retrieve", "alice", "hi", "--k", "0"), "Invalid value for '--k'"),
    (("retrieve", "alice"), "Missing argument 'query'"),
])
def test_a_bad_argument_is_one_line_naming_the_help(tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    out = invoke("--store", str(tmp_path / "store"), *args)
    assert out.exit_code == 2
    lines = [ln for ln in out.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and says in lines[0] and "retrieve --help`)" in lines[0], out.output   # prog name: the runner's


def test_consolidate_warns_of_users_the_store_does_not_hold(sample_store: Store) -> None:
    """`--users` with a typo: the run has nothing to do (exit 0, "0 users"), but says which names it
    did not find instead of passing for a quiet night."""
    for extra in ([], ["--rebuild-graph", "--engine", "local"]):
        out = invoke("--store", sample_store.uri, "consolidate", "--users", "alice,alcie", *extra)
        assert out.exit_code == 0, out.output
        assert "no messages in" in out.output and "alcie" in out.output and "alice," not in out.output
