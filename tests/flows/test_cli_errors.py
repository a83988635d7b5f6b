"""The `mnemo` command line refuses what it cannot use with one line and exit code 2, before it
writes anything: a folder that holds no store, a blank MNEMO_STORE, settings out of their range, an
address it cannot serve on, a Dask scheduler it cannot reach, a backfill's missing archive. And its
help shows every bracketed note, its flags default to the settings the nightly tasks read."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.cli.context import store_exists
from memory.errors import ConfigError
from memory.settings import RetrievalSettings, Settings
from memory.store import Store
from tests.helpers import LOCOMO, REPO, SAMPLE


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def one_line_error(out: Any, says: str) -> None:
    """Exit 2, and `says` in the one line on stderr (no traceback)."""
    assert out.exit_code == 2, out.output
    assert out.stderr.startswith("error: ") and says in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.output


@pytest.mark.parametrize("args", [("forget", "alice"), ("retrieve", "alice", "guitar"), ("consolidate",),
                                  ("stats",), ("doctor",), ("profile", "alice"), ("train-reranker",)])
def test_a_folder_holding_no_store_is_refused(tmp_path: Path, args: tuple[str, ...]) -> None:
    """An existing folder without mnemo tables is a mistyped --store: no "0 messages forgotten", no
    "0 items", no runs table written into it."""
    folder = tmp_path / "not-a-store"
    folder.mkdir()
    out = invoke("--store", str(folder), *args)
    one_line_error(out, f"no store at {folder} (the folder holds no mnemo tables)")
    assert os.listdir(folder) == []


def test_a_store_is_a_folder_with_mnemo_tables_or_a_uri(tmp_path: Path) -> None:
    assert not store_exists(str(tmp_path))                        # a folder, empty
    (tmp_path / "notes.lance").mkdir()
    assert not store_exists(str(tmp_path))                        # no mnemo table in it
    Store(str(tmp_path)).table("messages")
    assert store_exists(str(tmp_path))
    assert store_exists("s3://bucket/mnemo") and store_exists("memory://x")   # taken as given, as before
    assert not store_exists(str(tmp_path / "missing"))


@pytest.mark.parametrize("how", ["env", "flag"])
def test_a_blank_store_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, how: str) -> None:
    """`MNEMO_STORE=` is not the current folder: a consolidation there would write its runs table."""
    monkeypatch.chdir(tmp_path)
    if how == "env":
        monkeypatch.setenv("MNEMO_STORE", "")
    out = invoke("consolidate") if how == "env" else invoke("--store", " ", "consolidate")
    one_line_error(out, "invalid setting store (MNEMO_STORE): Value error, the store is set but blank")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("variable, value, says", [
    ("MNEMO_EMBED_BATCH_SIZE", "0", "embed_batch_size (MNEMO_EMBED_BATCH_SIZE): Input should be greater"),
    ("MNEMO_EMBED_DEVICE", "tpu", "embed_device (MNEMO_EMBED_DEVICE): Value error, unknown device 'tpu'"),
    ("MNEMO_RETRIEVAL_CALIB_HIGH_Q", "7", "retrieval.calib_high_q (MNEMO_RETRIEVAL_CALIB_HIGH_Q): Input should"),
    ("MNEMO_RETRIEVAL_PORT", "99999", "retrieval.port (MNEMO_RETRIEVAL_PORT): Input should be less"),
    ("MNEMO_RETRIEVAL_KINDS", '["bogus"]', "retrieval.kinds (MNEMO_RETRIEVAL_KINDS): Value error, unknown memory "
     "kinds ['bogus']"),
])
def test_a_setting_out_of_its_range_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                variable: str, value: str, says: str) -> None:
    Store(str(tmp_path)).table("messages")
    monkeypatch.setenv(variable, value)
    one_line_error(invoke("--store", str(tmp_path), "retrieve", "alice", "guitar", "--strategy", "calibrated"),
                   f"invalid setting {says}")


def test_serve_refuses_a_port_out_of_range(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import flows.cli.retrieve as cli_retrieve
    import flows.service

    served: list[int] = []
    monkeypatch.setattr(cli_retrieve, "open_retriever", lambda settings, serving=False: "retriever")
    monkeypatch.setattr(flows.service, "serve", lambda r, host, port, settings=None: served.append(port))
    one_line_error(invoke("--store", str(tmp_path), "serve", "--port", "99999"),
                   "invalid value for setting retrieval.port (MNEMO_RETRIEVAL_PORT)")
    assert served == []
    import flows.mcp

    monkeypatch.setattr(flows.service, "configure_writes", lambda r, settings=None: None)
    monkeypatch.setattr(flows.mcp, "run", lambda r, transport, host, port: served.append(port))
    out = invoke("--store", str(tmp_path), "mcp", "--transport", "http", "--port", "0")
    assert out.exit_code == 2 and "Invalid value for '--port'" in out.output and served == []


@pytest.mark.parametrize("command", [["serve"], ["mcp", "--transport", "http"]])
def test_a_server_on_a_port_in_use_is_exit_2_naming_it(tmp_path: Path, command: list[str]) -> None:
    """uvicorn exits 3 when it cannot bind, the code of "LLM work set aside": the CLI says 2, and where
    (the HTTP service and the MCP server alike)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = subprocess.run([sys.executable, "-m", "flows.cli", "--store", str(tmp_path / "s"), *command,
                              "--port", str(port)], cwd=REPO, capture_output=True, text=True, timeout=300,
                             env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert res.returncode == 2, res.stderr
    assert f"error: cannot serve on 127.0.0.1:{port}: the address is in use" in res.stderr
    assert "Traceback" not in res.stderr


def test_an_unreachable_dask_scheduler_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Refused before the run lease and Prefect start, within Dask's connect timeout (1 s here)."""
    import dask
    from distributed import LocalCluster   # first: its config defaults, which `dask.config.set` keeps below

    import flows.consolidate

    def prefect_started() -> None:
        raise AssertionError("Prefect started before the scheduler was reached")

    monkeypatch.setattr(flows.consolidate, "reap_orphans", prefect_started)
    store = str(tmp_path / "store")
    assert invoke("--store", store, "ingest", str(SAMPLE), "--format", "jsonl").exit_code == 0   # work to do
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        out = invoke("--store", store, "consolidate", "--dask-address", "tcp://127.0.0.1:1")
    one_line_error(out, "cannot reach the Dask scheduler at tcp://127.0.0.1:1: Timed out trying to connect")
    with pytest.raises(ConfigError, match="cannot reach the Dask scheduler at foo://x: unknown address scheme"):
        flows.consolidate.check_scheduler("foo://x", timeout_s=1)
    with LocalCluster(n_workers=0, processes=False, protocol="tcp", dashboard_address=None) as cluster:
        flows.consolidate.check_scheduler(cluster.scheduler_address, timeout_s=5)   # a scheduler that answers


@pytest.mark.parametrize("args, says", [(("{tmp}/missing.jsonl", "-f", "jsonl"), "archive not found"),
                                        ((str(SAMPLE), "-f", "nope"), "unknown archive format 'nope'"),
                                        ((str(SAMPLE), "-f", "jsonl", "--user", "u"), "for format beam only"),
                                        ((str(SAMPLE), "-f", "jsonl", "--observations-as-fragments"),
                                         "only format locomo records observations to import as fragments, not jsonl"),
                                        (("{tmp}", "-f", "jsonl"), "is a directory: format jsonl reads one file")])
def test_backfill_checks_its_archive_before_the_flow(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                     args: tuple[str, ...], says: str) -> None:
    import flows.consolidate

    def run_flow(*_: Any, **__: Any) -> None:
        raise AssertionError("the flow started")

    monkeypatch.setattr(flows.consolidate, "run_flow", run_flow)
    out = invoke("--store", str(tmp_path / "store"), "backfill", *(a.format(tmp=tmp_path) for a in args))
    one_line_error(out, says)
    assert not (tmp_path / "store").exists()              # no store folder, no lock file


@pytest.mark.skipif(not LOCOMO.exists(), reason="LoCoMo dev split not available")
def test_ingest_of_an_archive_no_row_of_which_reads_fails(tmp_path: Path) -> None:
    """The wrong --format quarantines every row: exit 1 saying so, not a quiet success; the rows are
    kept in the quarantine table. A flag the format has no use for is refused before anything is read."""
    store = str(tmp_path / "store")
    out = invoke("--store", store, "ingest", str(LOCOMO), "--format", "longmemeval")
    assert out.exit_code == 1 and "could be read as longmemeval: is --format right?" in out.stderr, out.output
    assert Store(store).read("quarantine").num_rows == 5 and Store(store).read("messages").num_rows == 0
    out = invoke("--store", store, "ingest", str(SAMPLE), "--format", "jsonl", "--observations-as-fragments")
    one_line_error(out, "only format locomo records observations to import as fragments, not jsonl")
    assert invoke("--store", store, "ingest", str(SAMPLE), "--format", "jsonl").exit_code == 0


def test_local_engine_and_graph_refuse_what_they_cannot_use(tmp_path: Path) -> None:
    """`--engine local` runs in this process (no Dask to join); `graph` of a user the store holds no
    message of is a typo, not an empty page."""
    store = str(tmp_path / "store")
    assert invoke("--store", store, "ingest", str(SAMPLE), "--format", "jsonl").exit_code == 0
    for flag in (("--dask-local", "2"), ("--dask-address", "tcp://127.0.0.1:1")):
        out = invoke("--store", store, "consolidate", "--engine", "local", *flag)
        one_line_error(out, "--dask-local and --dask-address need --engine prefect")
    out = invoke("--store", store, "graph", "nobody", "--html", str(tmp_path / "g" / "page.html"))
    one_line_error(out, "the store holds no messages of user 'nobody'")
    assert not (tmp_path / "g").exists()


def test_the_retriever_refuses_unknown_kinds_however_made(tmp_path: Path) -> None:
    """Settings copied with `model_copy(update=...)` skip the validator; the retriever checks them."""
    from retrieval.retriever import InvalidQueryError, Retriever

    bogus = RetrievalSettings().model_copy(update={"kinds": ("bogus",)})
    with pytest.raises(InvalidQueryError, match=r"unknown memory kinds \['bogus'\]"):
        Retriever(Store(str(tmp_path)), bogus)
    with pytest.raises(ValueError, match="unknown memory kinds"):
        RetrievalSettings().with_overrides(kinds=("bogus",))


@pytest.mark.parametrize("flag, scope", [((), "user"), (("--scope", "global"), "global")])
def test_train_reranker_scope_defaults_to_the_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                      flag: tuple[str, ...], scope: str) -> None:
    """MNEMO_RETRIEVAL_RERANK_SCOPE is what the nightly train task reads; the command follows it too."""
    import flows.cli.retrieve as cli_retrieve
    import retrieval.rerank

    class Opened:
        settings = RetrievalSettings()

    scopes: list[str] = []
    monkeypatch.setattr(cli_retrieve, "open_retriever", lambda settings, serving=False: Opened())
    monkeypatch.setattr(retrieval.rerank, "train_reranker", lambda r, scope, cfg, run_id: scopes.append(scope) or [])
    monkeypatch.setenv("MNEMO_RETRIEVAL_RERANK_SCOPE", "user")
    out = invoke("--store", str(tmp_path), "train-reranker", *flag)
    assert out.exit_code == 0, out.output
    assert scopes == [scope] and f"train-reranker ({scope}): no user has feedback" in out.stdout


@pytest.mark.parametrize("args, notes", [
    ((), ["--store", "[env MNEMO_STORE, default ./memstore]"]),
    (("retrieve",), ["[default 10]", "[default: MNEMO_RETRIEVAL_DEFAULT_STRATEGY]",
                     "[default: MNEMO_RETRIEVAL_CONTEXT_TOKENS, 1500]"]),
    (("serve",), ["[default: MNEMO_RETRIEVAL_HOST, 127.0.0.1]", "[default: MNEMO_RETRIEVAL_PORT, 8765]"]),
    (("mcp",), ["[default: MNEMO_RETRIEVAL_HOST, 127.0.0.1]", "[default 8766]"]),
    (("train-reranker",), ["[default: MNEMO_RETRIEVAL_RERANK_SCOPE, global]", "[default: settings rerank_epochs]"]),
    (("bench", "rerank"), ["[default: settings rerank_epochs]"]),
    (("doctor",), ["session rows disagreeing with their messages", "forget runs left unfinished",
                   "validity naming a row stored nowhere", "missing sources and unfinished forgets still do",
                   "remake session rows", "clear validity pointers"]),
])
def test_help_keeps_every_bracketed_note(args: tuple[str, ...], notes: list[str]) -> None:
    out = invoke(*args, "--help")
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())            # wrapped lines joined
    for note in notes:
        assert note in text, (note, out.output)
    assert "only missing sources can" not in text
