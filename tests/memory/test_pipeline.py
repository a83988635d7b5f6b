"""The consolidation stages alone and together, without Prefect: idempotence, crash recovery,
batch-split equivalence, quarantine of malformed LLM answers, tenant scoping."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pickle

import numpy as np
import pytest

from memory.errors import ConfigError
from memory.ingest import ingest
from memory.llm.base import LLMBackend, LLMRequest, LLMResponse, register_backend
from memory.read import stats
from memory.runs import RunReport, consolidate, open_store
from memory.settings import Settings
from memory.stages import STAGES, stage
from memory.stages.commit import commit
from memory.stages.embed import embed, embed_insights
from memory.stages.extract import extract
from memory.stages.link import link
from memory.stages.load import load_shard
from memory.stages.reason import reason
from memory.stages.shard import StageContext
from memory.store import Store
from tests.helpers import SAMPLE, SampleSplit, copy_store, killed_before, snapshot

MEMORY_TABLES = ("messages", "fragments", "insights", "clusters", "links", "watermarks")


def _settings(tmp_path: Path, name: str = "store", **kw: Any) -> Settings:
    return Settings(store=str(tmp_path / name), **kw)


def _snapshot(store: Store) -> dict[str, Any]:
    """Ids per table, plus content of the memory rows (run ids and timestamps excluded)."""
    return snapshot(store, MEMORY_TABLES, content_columns=["id", "text", "date", "source_ids"])


@pytest.fixture
def consolidated(consolidated_sample: tuple[Path, RunReport], sample_store: Store) -> tuple[Settings, Store, Any]:
    """The sample ingested and consolidated once (a private copy of the session's store) and its report."""
    return Settings(store=sample_store.uri), sample_store, consolidated_sample[1]


def test_stages_run_alone(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    store = open_store(settings)
    ingest(store, SAMPLE, "jsonl")
    users = store.users()
    state = load_shard(store, users, "run-test")
    assert state.sessions and all(s.messages for s in state.sessions)
    ctx = StageContext.create(store, settings, "run-test")

    state = extract(state, ctx)
    assert state.fragments
    msg_ids = {(m["user_id"], m["message_id"]) for m in state.message_rows}
    for f in state.fragments:
        assert f["category"] in ("factual", "experiential", "subjective")
        assert f["source_ids"] and all((f["user_id"], sid) in msg_ids for sid in f["source_ids"])

    state = embed(state, ctx)
    vecs = np.stack([f["vector"] for f in state.fragments])
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)

    state = link(state, ctx)
    assert state.clusters and all(f.get("cluster_id") for f in state.fragments)
    assert all(lk.similarity > settings.theta for lk in state.links)

    state = reason(state, ctx)
    state = embed_insights(state, ctx)
    assert state.insights
    for row in state.insights:
        assert row["inference_type"] in ("extension", "accumulation", "specification", "transformation", "connection")
        assert row["source_ids"] and len(row["vector"]) == 384

    assert store.count_by_user("fragments") == {}  # nothing written before commit
    assert pickle.loads(pickle.dumps(state)).counts() == state.counts()  # Dask moves it between workers
    written = commit(store, state)
    assert written["fragments"] == len(state.fragments)
    assert store.read("watermarks").num_rows == len(users)


def test_stage_registry() -> None:
    assert [s.name for s in STAGES] == ["extract", "embed", "supersede", "link", "reason", "embed-insights",
                                        "weave", "summarize", "topics"]
    assert [s.name for s in STAGES if s.retryable] == ["extract", "reason", "summarize", "topics"]
    assert stage("weave") is STAGES[6]
    with pytest.raises(ConfigError, match="unknown stage"):
        stage("nope")


def test_consolidation_makes_memory(consolidated: tuple[Settings, Store, Any]) -> None:
    _, store, report = consolidated
    counts = stats(store)["users"]
    assert set(counts) == {"alice", "bob"}
    for row in counts.values():
        assert row["messages"] > 0 and row["fragments"] > 0
    assert sum(r["insights"] for r in counts.values()) > 0
    assert report.counts["fragments"] == sum(r["fragments"] for r in counts.values())
    assert [r["kind"] for r in store.read("runs").to_pylist()].count("consolidate") == 1


def test_rerun_changes_nothing(consolidated: tuple[Settings, Store, Any]) -> None:
    settings, store, _ = consolidated
    before = _snapshot(store)
    again = consolidate(store, settings)
    assert again.counts.get("sessions", 0) == 0 and again.llm.get("calls", 0) == 0
    assert _snapshot(store) == before


def test_two_batches_equal_one(consolidated: tuple[Settings, Store, Any], split_sample_stores: SampleSplit,
                               tmp_path: Path) -> None:
    _, one, _ = consolidated
    two = copy_store(split_sample_stores.two, tmp_path / "two")  # batch 1 consolidated, then batch 2
    s1, s2 = _snapshot(one), _snapshot(two)
    for key in ("fragments", "insights", "fragments:content", "insights:content", "clusters", "links"):
        assert s1[key] == s2[key], key


@pytest.mark.parametrize("crash_before", ["clusters", "insights", "watermarks"])
def test_crash_mid_commit_then_rerun(consolidated: tuple[Settings, Store, Any], tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch, crash_before: str) -> None:
    """A run killed between two writes of a stage, run again, equals an uninterrupted run."""
    _, clean, _ = consolidated
    settings = _settings(tmp_path)
    store = open_store(settings)
    ingest(store, SAMPLE, "jsonl")
    with killed_before(monkeypatch, crash_before):
        consolidate(store, settings)
    consolidate(store, settings)
    assert _snapshot(store) == _snapshot(clean)


@register_backend("malformed-extract")
class _MalformedExtract(LLMBackend):
    """Answers extraction with broken JSON (twice: the retry too), reasoning correctly."""

    name = "malformed-extract"
    live = False
    default_model = "broken-v1"

    def complete(self, requests: list[LLMRequest]) -> list[LLMResponse]:
        return [LLMResponse(text='{"Factual_Information": [ oops') if r.task == "extract"
                else LLMResponse(text='{"extended_insight": []}') for r in requests]


def test_malformed_answers_are_quarantined_and_run_goes_on(tmp_path: Path) -> None:
    settings = _settings(tmp_path, llm="malformed-extract")
    store = open_store(settings)
    ingest(store, SAMPLE, "jsonl")
    report = consolidate(store, settings)
    q = store.read("quarantine").to_pylist()
    extract_q = [r for r in q if r["stage"] == "extract"]
    assert len(extract_q) == report.counts["sessions"] > 0
    assert all("oops" in r["raw"] and r["reason"] for r in extract_q)
    assert report.llm["calls"] == 2 * report.counts["sessions"]  # each retried once
    assert store.read("watermarks").num_rows == len(store.users())


def test_rows_stay_with_their_user(consolidated: tuple[Settings, Store, Any]) -> None:
    _, store, _ = consolidated
    users = store.users()
    assert users == ["alice", "bob"]
    checked = {"fragments": 0, "insights": 0}
    for user in users:
        own = set(store.read("messages", user, columns=["message_id"]).column("message_id").to_pylist())
        for name in checked:
            rows = store.read(name, user, columns=["user_id", "source_ids"]).to_pylist()
            assert all(r["user_id"] == user for r in rows)
            assert all(set(r["source_ids"]) <= own for r in rows)
            checked[name] += len(rows)
    assert all(checked.values()), checked
