"""Flows and CLI after review 2: the nightly flow finishes a killed forget before it consolidates, a
relative store reaches Dask workers as an absolute path (and a worker that finds no store refuses),
a backfill of an unreadable archive consolidates nobody and exits 1, `--engine local` trains the
reranker, and `--users` trains only those users' rerankers. Real store, real Prefect runs."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from lancedb.expr import col, lit
from typer.testing import CliRunner

import flows.consolidate as fc
from flows.cli import app
from memory.errors import ConfigError
from memory.ingest import ingest
from memory.runs import open_store
from memory.settings import Settings
from memory.store import Store
from retrieval.retriever import Retriever
from tests.helpers import SAMPLE, forget_killed_before_messages

QUERY = "What guitar did Alice buy?"


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def cite(store: Store, user: str = "alice", query: str = QUERY) -> None:
    """One feedback row of `user`: five memories shown, the first cited."""
    r = Retriever.open(store.uri, Settings(store=store.uri))
    ids = [it.id for it in r.retrieve(user, query, k=5).items]
    r.feedback(user, query, ids, ids[:1])


def scopes(store: Store) -> list[str]:
    return sorted(r["scope"] for r in store.read("rerankers", columns=["scope"]).to_pylist()) \
        if store.has_table("rerankers") else []


def test_the_nightly_flow_finishes_a_killed_forget_first(prefect_harness: None, sample_store: Store,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    store = sample_store
    forget_killed_before_messages(monkeypatch, store, "alice", ["alice-s2"])
    fc.consolidate_flow(users=None, overrides={"store": store.uri})
    assert store.read("messages", where=col("session_id") == lit("alice-s2")).num_rows == 0
    rows = store.read("fragments", "alice", columns=["source_ids"]).to_pylist()
    assert rows and not any(i.startswith("alice-s2-") for r in rows for i in r["source_ids"] or [])
    runs = store.read("runs", where=col("kind") == lit("forget")).to_pylist()
    assert [r["status"] for r in runs] == ["completed"]


def test_a_relative_store_is_absolute_for_the_task_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert fc.absolute_store(Settings(store="st")).store == str(tmp_path / "st")
    assert fc.absolute_store(Settings(store="s3://bucket/st")).store == "s3://bucket/st"
    assert fc.resolve_settings(Settings(store="st"), None).store == str(tmp_path / "st")


def test_the_load_task_refuses_a_store_without_messages(tmp_path: Path) -> None:
    """A worker that sees no store there says so, and makes nothing."""
    where = tmp_path / "nowhere"
    with pytest.raises(ConfigError, match="no store with messages at .*nowhere .*folder"):
        fc.load_task.fn(["alice"], Settings(store=str(where)), "run")
    assert not where.exists()
    Store(str(where)).table("runs")            # a store, but no messages table
    with pytest.raises(ConfigError, match="no store with messages"):
        fc.load_task.fn(["alice"], Settings(store=str(where)), "run")


@pytest.mark.slow
def test_a_dask_worker_in_another_folder_consolidates_a_relative_store(prefect_harness: None, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from distributed import LocalCluster

    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")          # the worker process starts (and stays) here
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None)
    try:
        monkeypatch.chdir(tmp_path)
        store = open_store(Settings(store="st"))
        assert ingest(store, SAMPLE, "jsonl").users
        result = fc.run_flow("consolidate", Settings(store="st", dask_address=cluster.scheduler_address), users=None)
    finally:
        cluster.close()
    assert result["counts"]["sessions"] > 0
    assert store.read("watermarks").num_rows == 2
    assert not (tmp_path / "elsewhere" / "st").exists()


def test_a_backfill_of_an_unreadable_archive_consolidates_nobody(prefect_harness: None, tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    assert invoke("--store", store, "ingest", str(SAMPLE), "--format", "jsonl").exit_code == 0   # users pending
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"user_id": "carol", "session_id": "c1", "message_id": "c1-1", "speaker": "Carol",
                               "text": "hi", "timestamp": "not-a-time"}) + "\n")
    out = invoke("--store", store, "backfill", str(bad), "--format", "jsonl", "--llm", "rules")
    assert out.exit_code == 1, out.output
    assert "0 users" in out.stdout and "could be read as jsonl" in out.stderr and "Traceback" not in out.output
    st = Store(store)
    assert not st.has_table("watermarks") or st.read("watermarks").num_rows == 0
    assert "backfill" not in {r["kind"] for r in st.read("runs", columns=["kind"]).to_pylist()}


def test_the_local_engine_trains_the_reranker(sample_store: Store) -> None:
    cite(sample_store)
    out = invoke("--store", sample_store.uri, "consolidate", "--engine", "local", "--llm", "rules")
    assert out.exit_code == 0, out.output
    assert "reranker global" in out.stdout
    assert scopes(sample_store) == ["global"]
    again = invoke("--store", sample_store.uri, "consolidate", "--engine", "local", "--llm", "rules")
    assert again.exit_code == 0, again.output
    assert "reranker global" not in again.stdout and scopes(sample_store) == ["global"]   # nothing waits any more


def test_users_flag_trains_only_those_users_rerankers(prefect_harness: None, sample_store: Store, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MNEMO_RETRIEVAL_RERANK_SCOPE", "user")
    cite(sample_store)                                     # alice's feedback waits
    out = invoke("--store", sample_store.uri, "consolidate", "--llm", "rules", "--users", "bob")
    assert out.exit_code == 0, out.output
    assert "0 users with new sessions" in out.stdout   # bob owes nothing: alice's feedback does not start a run
    new = tmp_path / "bob.jsonl"                           # bob gets a new session: the run trains after it
    new.write_text(json.dumps({"user_id": "bob", "session_id": "bob-s9", "message_id": "bob-s9-m01",
                               "speaker": "Bob", "text": "I bought a red kayak today.",
                               "timestamp": "2030-01-01T10:00:00Z"}) + "\n")
    ingest(sample_store, new, "jsonl")
    out = invoke("--store", sample_store.uri, "consolidate", "--llm", "rules", "--users", "bob")
    assert out.exit_code == 0, out.output
    assert "1 users with new sessions" in out.stdout
    assert scopes(sample_store) == []                      # not user:alice, not global
    out = invoke("--store", sample_store.uri, "consolidate", "--llm", "rules", "--engine", "local")
    assert out.exit_code == 0, out.output
    assert scopes(sample_store) == ["user:alice"]          # a run of every user trains it
    assert os.environ["MNEMO_RETRIEVAL_RERANK_SCOPE"] == "user"
