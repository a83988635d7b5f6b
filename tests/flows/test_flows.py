"""The Prefect flows (`consolidate`, `backfill`) against a temporary Prefect API: they build the same
memory as the stages run without Prefect, a re-run changes nothing, backfill equals ingest +
consolidate, a transient LLM failure retries only its stage (and does not pay twice for what the
first attempt cached), and a fatal one fails the run without moving any watermark.

All flow tests share one session-scoped `prefect_test_harness` (a Prefect server takes seconds to start).
"""
from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

import flows.consolidate as fc
from memory.errors import LLMError
from memory.ingest import ingest
from memory.llm.base import LLMRequest, LLMResponse, RulesAnswers, register_backend
from memory.read import stats
from memory.runs import open_store
from memory.settings import Settings
from memory.store import Store
from tests.helpers import SAMPLE, memory_snapshot, unique_ids

# -- the Prefect API ----------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


# -- helpers ------------------------------------------------------------------------------
def _settings(root: Path, **kw: Any) -> Settings:
    return Settings(store=str(root), **kw)


def _ingested(root: Path) -> Store:
    store = open_store(_settings(root))
    report = ingest(store, SAMPLE, "jsonl")
    assert report.users
    return store


def _runs(store: Store) -> list[dict[str, Any]]:
    """The `runs` rows of consolidation runs (ingest leaves its own rows too)."""
    return [r for r in store.read("runs").to_pylist() if r["kind"] != "ingest"]


def _flow_run_id(state: Any) -> str:
    return str(state.state_details.flow_run_id)


def _task_runs(flow_run_id: str) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))


def _final_task_run(flow_run_id: str, task: str, timeout_s: float = 20.0) -> Any:
    """The one run of `task` in a flow run, once the API recorded its final state (events lag a little)."""
    deadline = time.monotonic() + timeout_s
    while True:
        runs = [t for t in _task_runs(flow_run_id) if re.fullmatch(rf"{task}(-[0-9a-f]+)?", t.name)]
        if len(runs) == 1 and runs[0].state_type is not None and runs[0].state_type.value in ("COMPLETED", "FAILED"):
            return runs[0]
        assert time.monotonic() < deadline, f"no final {task} task run recorded: {runs}"
        time.sleep(0.5)


# -- shared runs --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def flow_store(prefect_harness: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Store, dict]:
    """The sample archive ingested, then consolidated once by the flow."""
    root = tmp_path_factory.mktemp("flow") / "store"
    store = _ingested(root)
    result = fc.consolidate_flow(users=None, overrides={"store": str(root)})
    return root, store, result


# -- tests --------------------------------------------------------------------------------
def test_consolidate_flow_builds_memory(flow_store: tuple[Path, Store, dict]) -> None:
    _, store, result = flow_store
    users = stats(store)["users"]
    assert len(users) >= 2
    for user, row in users.items():
        assert row["messages"] > 0 and row["fragments"] > 0, (user, row)
    assert sum(row["insights"] for row in users.values()) > 0
    assert result["counts"]["fragments"] == sum(row["fragments"] for row in users.values())
    assert result["counts"]["insights"] == sum(row["insights"] for row in users.values())
    runs = _runs(store)
    assert [r["kind"] for r in runs] == ["consolidate"]
    assert runs[0]["id"] == result["run_id"] and runs[0]["status"] == "completed"
    assert sorted(runs[0]["users"]) == sorted(users)
    assert store.read("watermarks").num_rows == len(users)
    unique_ids(store)


def test_flow_equals_stages_without_prefect(flow_store: tuple[Path, Store, dict], module_sample_store: Store) -> None:
    _, store, _ = flow_store
    assert memory_snapshot(store) == memory_snapshot(module_sample_store)


def test_rerun_changes_nothing(flow_store: tuple[Path, Store, dict]) -> None:
    root, store, _ = flow_store
    before = memory_snapshot(store)
    again = fc.consolidate_flow(users=None, overrides={"store": str(root)})
    assert again["counts"].get("sessions", 0) == 0 and again["llm"].get("calls", 0) == 0
    assert memory_snapshot(store) == before
    runs = _runs(store)
    assert len(runs) == 2 and {r["kind"] for r in runs} == {"consolidate"}


def test_backfill_equals_ingest_then_consolidate(prefect_harness: None, flow_store: tuple[Path, Store, dict],
                                                 tmp_path: Path) -> None:
    _, reference, _ = flow_store
    root = tmp_path / "store"
    result = fc.backfill_flow(path=str(SAMPLE), fmt="jsonl", overrides={"store": str(root)})
    store = open_store(_settings(root))
    assert "ingest" in result and result["counts"]["fragments"] > 0
    got, want = memory_snapshot(store), memory_snapshot(reference)
    for key in ("messages", "sessions", "fragments", "insights", "fragments:content", "insights:content",
                "clusters", "links", "watermarks", "stats"):
        assert got[key] == want[key], key
    runs = _runs(store)
    assert [r["kind"] for r in runs] == ["backfill"]

    # resumable: backfilling the same archive again pays nothing and changes nothing
    again = fc.backfill_flow(path=str(SAMPLE), fmt="jsonl", overrides={"store": str(root)})
    assert again["counts"].get("sessions", 0) == 0
    assert memory_snapshot(store) == got


# -- LLM failures ------------------------------------------------------------------------
_CALLS: list[tuple[str, int, int, str | None]] = []  # (task, Prefect attempt, requests sent, user)
_CALLS_LOCK = threading.Lock()


def _attempt() -> int:
    from prefect.context import TaskRunContext

    ctx = TaskRunContext.get()
    return ctx.task_run.run_count if ctx else 0


class _Wrapped(RulesAnswers):
    """Answers like `rules`, but through a live backend's path (cache and all), recording each call."""

    live = True
    default_model = "rules-under-test"

    def complete(self, requests: list[LLMRequest]) -> list[LLMResponse]:
        with _CALLS_LOCK:
            _CALLS.append((requests[0].task, _attempt(), len(requests), requests[0].context.get("user_id")))
        return super().complete(requests)

    def answer(self, request: LLMRequest, answer: LLMResponse, index: int) -> LLMResponse:
        return self.fail(request, answer, index) or answer

    def fail(self, request: LLMRequest, answer: LLMResponse, i: int) -> LLMResponse | None:
        return None


@register_backend("flaky")
class _Flaky(_Wrapped):
    """The first attempt of the extract stage gets a 503 for every other request."""

    name = "flaky"

    def fail(self, request: LLMRequest, answer: LLMResponse, i: int) -> LLMResponse | None:
        if request.task == "extract" and _attempt() == 1 and i % 2 == 1:
            return LLMResponse.failure("transient", "503 Service Unavailable")
        return None


@register_backend("broken")
class _Broken(_Wrapped):
    """Extraction fails for good for bob: the model does not exist on bob's server."""

    name = "broken"

    def fail(self, request: LLMRequest, answer: LLMResponse, i: int) -> LLMResponse | None:
        if request.task == "extract" and request.context.get("user_id") == "bob":
            return LLMResponse.failure("fatal", "404 model not found")
        return None


@pytest.fixture
def no_retry_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Same retry policy as production, without the 5 s wait."""
    monkeypatch.setattr(fc, "RETRY_DELAYS_S", [0, 0])


def test_transient_llm_failure_retries_the_stage(prefect_harness: None, no_retry_delay: None,
                                                 flow_store: tuple[Path, Store, dict], tmp_path: Path) -> None:
    _, reference, _ = flow_store
    root = tmp_path / "store"
    store = _ingested(root)
    _CALLS.clear()
    state = fc.consolidate_flow(users=None, overrides={"store": str(root), "llm": "flaky"}, return_state=True)
    assert state.is_completed(), state
    result = state.result()

    extract_calls = [(attempt, n) for task, attempt, n, _ in _CALLS if task == "extract"]
    assert [a for a, _ in extract_calls] == [1, 2], _CALLS  # one shard: failed once, retried once
    (_, first), (_, second) = extract_calls
    assert second == first // 2, "the retry must re-send only the failed requests (the rest is cached)"
    assert result["llm"]["cache_hits"] >= first - first // 2
    # the summary counts what was sent, the failed attempt's requests too (they were paid for)
    assert result["llm"]["calls"] == sum(n for _, _, n, _ in _CALLS) == _runs(store)[0]["llm_calls"]

    extract_run = _final_task_run(_flow_run_id(state), "extract")
    assert extract_run.run_count == 2 and extract_run.state_type.value == "COMPLETED"

    got, want = memory_snapshot(store), memory_snapshot(reference)
    for key in ("fragments", "insights", "fragments:content", "insights:content", "watermarks", "stats"):
        assert got[key] == want[key], key
    assert [r["status"] for r in _runs(store)] == ["completed"]


def test_fatal_llm_failure_fails_its_shard_only(
        prefect_harness: None, no_retry_delay: None, flow_store: tuple[Path, Store, dict], tmp_path: Path) -> None:
    """A fatal error is not retried; the other shards still commit; the run fails with the stage's own
    error and leaves a `failed` runs row; the failed user's watermark does not move."""
    _, reference, _ = flow_store
    root = tmp_path / "store"
    store = _ingested(root)
    assert sorted(store.users()) == ["alice", "bob"]
    _CALLS.clear()
    overrides = {"store": str(root), "llm": "broken", "shard_size": 1}
    state = fc.consolidate_flow(users=None, overrides=overrides, return_state=True)
    assert state.is_failed(), state
    assert "404 model not found" in (state.message or ""), state.message
    with pytest.raises(LLMError, match="404 model not found"):
        state.result()
    assert [a for task, a, _, user in _CALLS if task == "extract" and user == "bob"] == [1], \
        "a fatal error must not be retried"

    assert store.read("watermarks").column("user_id").to_pylist() == ["alice"]
    assert set(store.count_by_user("fragments")) == {"alice"}
    runs = _runs(store)
    assert [(r["status"], r["users"]) for r in runs] == [("failed", ["alice"])]

    # the next run (backend fixed) redoes bob only and converges to an uninterrupted run
    result = fc.consolidate_flow(users=None, overrides={"store": str(root)})
    assert result["counts"]["users"] == 1
    got, want = memory_snapshot(store), memory_snapshot(reference)
    for key in ("fragments", "insights", "fragments:content", "insights:content", "watermarks", "stats"):
        assert got[key] == want[key], key
