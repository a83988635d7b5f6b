"""LLMRunner over a real LanceDB store: the response cache, `replay`, re-asks, errors, quarantine rows."""
from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any, Callable

import pytest

from memory.errors import LLMError, LLMTransientError, ReplayMissError
from memory.llm.base import LLMBackend, LLMRequest, LLMResponse
from memory.llm.cache import ResponseCache
from memory.llm.replay import ReplayBackend
from memory.llm.runner import LLMRunner, LLMStats, check
from memory.store import Store

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "minLength": 1}},
    "required": ["answer"],
    "additionalProperties": False,
}


def _request(text: str, task: str = "extract") -> LLMRequest:
    return LLMRequest(task=task, prompt_version="test-v1", messages=[{"role": "user", "content": text}],
                      schema=SCHEMA, context={"text": text})


def _echo(request: LLMRequest) -> LLMResponse:
    return LLMResponse(text=json.dumps({"answer": request.messages[0]["content"]}), tokens_in=10, tokens_out=4)


class ScriptedBackend(LLMBackend):
    """A live fake: answers with `answer(request)` and records every batch it received."""

    name = "scripted"
    live = True
    default_model = "fake-model"

    def __init__(self, answer: Callable[[LLMRequest], LLMResponse] = _echo, model: str = "") -> None:
        super().__init__(model)
        self.answer = answer
        self.batches: list[list[LLMRequest]] = []

    def complete(self, requests: list[LLMRequest]) -> list[LLMResponse]:
        self.batches.append(list(requests))
        return [self.answer(r) for r in requests]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(str(tmp_path / "store"), dim=8)


def test_second_run_is_answered_from_the_cache(store: Store) -> None:
    requests = [_request(f"q{i}") for i in range(5)]
    first = LLMRunner(ScriptedBackend(), ResponseCache(store))
    answers, bad = first.run(requests)
    assert answers == [{"answer": f"q{i}"} for i in range(5)] and bad == []
    assert first.stats.as_dict() == {"calls": 5, "tokens_in": 50, "tokens_out": 20, "cache_hits": 0,
                                     "retries": 0, "quarantined": 0}
    rows = store.read("llm_cache").to_pylist()
    assert len(rows) == 5 and {r["model"] for r in rows} == {"fake-model"} and rows[0]["backend"] == "scripted"

    backend = ScriptedBackend()
    again = LLMRunner(backend, ResponseCache(store))
    answers2, _ = again.run(requests + [_request("new")])
    assert answers2 == answers + [{"answer": "new"}]
    assert again.stats.cache_hits == 5 and again.stats.calls == 1
    assert [[r.messages[0]["content"] for r in b] for b in backend.batches] == [["new"]]


def test_cache_is_per_model(store: Store) -> None:
    LLMRunner(ScriptedBackend(model="a"), ResponseCache(store)).run([_request("q")])
    other = LLMRunner(ScriptedBackend(model="b"), ResponseCache(store))
    other.run([_request("q")])
    assert other.stats.cache_hits == 0 and other.stats.calls == 1


def test_identical_requests_are_sent_once(store: Store) -> None:
    backend = ScriptedBackend()
    answers, _ = LLMRunner(backend, ResponseCache(store)).run([_request("same"), _request("x"), _request("same")])
    assert answers == [{"answer": "same"}, {"answer": "x"}, {"answer": "same"}]
    assert len(backend.batches) == 1 and len(backend.batches[0]) == 2


def test_replay_answers_from_cache_and_misses_loudly(store: Store) -> None:
    LLMRunner(ScriptedBackend(model="rec"), ResponseCache(store)).run([_request("a"), _request("b")])
    replay = LLMRunner(ReplayBackend(model="rec"), ResponseCache(store))
    answers, bad = replay.run([_request("b"), _request("a")])
    assert answers == [{"answer": "b"}, {"answer": "a"}] and bad == [] and replay.stats.cache_hits == 2
    assert store.read("llm_cache").num_rows == 2  # replay never writes

    with pytest.raises(ReplayMissError) as err:
        replay.run([_request("a"), _request("unseen", task="reason"), _request("other")])
    assert err.value.missing == 2 and err.value.task == "reason" and err.value.prompt_version == "test-v1"
    assert "2 request" in str(err.value)
    assert pickle.loads(pickle.dumps(err.value)).missing == 2


def test_invalid_answer_is_reasked_once_then_cached_under_the_original_key(store: Store) -> None:
    def answer(r: LLMRequest) -> LLMResponse:
        return _echo(r) if len(r.messages) > 1 else LLMResponse(text="Sure! {answer: oops}")

    backend = ScriptedBackend(answer)
    runner = LLMRunner(backend, ResponseCache(store))
    answers, bad = runner.run([_request("q")])
    assert answers == [{"answer": "q"}] and bad == []
    assert runner.stats.retries == 1 and runner.stats.calls == 2
    note = backend.batches[1][0].messages[-1]
    assert note["role"] == "user" and "not valid JSON" in note["content"] and "only the JSON" in note["content"]
    again = LLMRunner(ScriptedBackend(answer), ResponseCache(store))
    assert again.run([_request("q")])[0] == [{"answer": "q"}] and again.stats.calls == 0


def test_semantic_validation_callback(store: Store) -> None:
    def no_q(answer: dict[str, Any], _: LLMRequest) -> None:
        if answer["answer"].startswith("q"):
            raise ValueError("answers may not start with q")

    runner = LLMRunner(ScriptedBackend(), ResponseCache(store))
    answers, bad = runner.run([_request("q1"), _request("ok")], validate=no_q)
    assert answers == [None, {"answer": "ok"}]
    assert len(bad) == 1 and "may not start with q" in bad[0].reason and bad[0].raw == '{"answer": "q1"}'
    # the invalid answer and its re-ask's are on record, but a live backend that may answer otherwise
    # (no temperature 0) asks again; replay repeats the quarantine from the record
    assert store.read("llm_cache").num_rows == 3
    backend = ScriptedBackend()
    again = LLMRunner(backend, ResponseCache(store))
    assert again.run([_request("q1"), _request("ok")], validate=no_q)[0] == [None, {"answer": "ok"}]
    assert again.stats.cache_hits == 1 and [[r.messages[-1]["content"][:2] for r in b] for b in backend.batches] \
        == [["q1"], ["Yo"]]
    replay = LLMRunner(ReplayBackend(model="fake-model"), ResponseCache(store))
    answers, bad2 = replay.run([_request("q1"), _request("ok")], validate=no_q)
    assert answers == [None, {"answer": "ok"}] and [q.raw for q in bad2] == ['{"answer": "q1"}']
    assert bad2[0].reason == bad[0].reason and replay.stats.calls == 0


def test_a_deterministic_live_backend_repeats_a_quarantine_from_the_record(store: Store) -> None:
    class Greedy(ScriptedBackend):
        temperature = 0.0

    backend = Greedy(lambda r: LLMResponse(text='{"answer": ""}', tokens_out=3))
    first = LLMRunner(backend, ResponseCache(store))
    assert first.run([_request("a")])[0] == [None] and first.stats.calls == 2
    again = LLMRunner(backend, ResponseCache(store))
    answers, bad = again.run([_request("a")])
    assert answers == [None] and len(bad) == 1 and bad[0].raw == '{"answer": ""}'
    assert again.stats.calls == 0 and again.stats.cache_hits == 2 and len(backend.batches) == 2



def test_an_answer_cut_at_the_token_limit_is_asked_again_under_a_higher_limit(store: Store) -> None:
    """A deterministic backend's invalid answer is repeated from the record, one cut at the token limit
    too while the limit stays (a re-run pays nothing); once the operator raises the limit it is asked
    again (replay repeats it whatever the limit)."""
    class Greedy(ScriptedBackend):
        temperature = 0.0
        max_tokens = 8

    cut = Greedy(lambda r: LLMResponse(text='{"answer": "tr', tokens_out=8, truncated=True))
    first = LLMRunner(cut, ResponseCache(store))
    assert first.run([_request("a")])[0] == [None] and first.stats.calls == 2
    assert store.read("llm_cache", columns=["truncated_at"]).column("truncated_at").to_pylist() == [8, 8]
    same = LLMRunner(cut, ResponseCache(store))           # the same limit: the same cut answer, from the record
    assert same.run([_request("a")])[0] == [None] and same.stats.calls == 0 and same.stats.cache_hits == 2
    replay = LLMRunner(ReplayBackend(model="fake-model"), ResponseCache(store))
    answers, bad = replay.run([_request("a")])
    assert answers == [None] and [q.raw for q in bad] == ['{"answer": "tr'] and replay.stats.calls == 0
    raised = Greedy()                                     # a larger limit: the whole answer
    raised.max_tokens = 4096
    again = LLMRunner(raised, ResponseCache(store))
    assert again.run([_request("a")])[0] == [{"answer": "a"}] and again.stats.calls == 1
    assert again.stats.cache_hits == 0


def test_quarantine_rows_fit_the_table(store: Store) -> None:
    runner = LLMRunner(ScriptedBackend(lambda r: LLMResponse(text='{"answer": ""}')), ResponseCache(store))
    answers, bad = runner.run([_request("a"), _request("b")])
    assert answers == [None, None] and len(bad) == 2 and runner.stats.quarantined == 2
    rows = [q.row("user-1", "run-1", f"session-{i}") for i, q in enumerate(bad)]
    assert set(rows[0]) == set(store.table("quarantine").schema.names)
    assert rows[0]["stage"] == "extract" and rows[0]["raw"] == '{"answer": ""}' and rows[0]["reason"]
    assert rows[0]["id"] == bad[0].row("user-1", "run-2", "session-0")["id"]  # stable across runs
    assert store.upsert("quarantine", rows) == 2
    stored = store.read("quarantine", "user-1").to_pylist()
    assert {r["source"] for r in stored} == {"session-0", "session-1"}


def test_transient_errors_raise_after_caching_the_good_answers(store: Store) -> None:
    def answer(r: LLMRequest) -> LLMResponse:
        if r.messages[0]["content"].startswith("down"):
            return LLMResponse.failure("transient", "APITimeoutError: timed out")
        return _echo(r)

    runner = LLMRunner(ScriptedBackend(answer), ResponseCache(store))
    with pytest.raises(LLMTransientError) as err:
        runner.run([_request("fine"), _request("down1"), _request("down2")])
    assert err.value.failed == 2 and "APITimeoutError" in str(err.value)
    assert [r["response"] for r in store.read("llm_cache").to_pylist()] == ['{"answer": "fine"}']
    # the retry pays only for what failed
    backend = ScriptedBackend()
    LLMRunner(backend, ResponseCache(store)).run([_request("fine"), _request("down1"), _request("down2")])
    assert [r.messages[0]["content"] for r in backend.batches[0]] == ["down1", "down2"]


def test_unmarked_errors_are_transient_fatal_ones_are_not(store: Store) -> None:
    with pytest.raises(LLMTransientError):
        LLMRunner(ScriptedBackend(lambda r: LLMResponse(text=None, error="boom"))).run([_request("a")])
    fatal = ScriptedBackend(lambda r: LLMResponse.failure("fatal", "401 bad key"))
    with pytest.raises(LLMError) as err:
        LLMRunner(fatal).run([_request("a")])
    assert not isinstance(err.value, LLMTransientError)


def test_rejected_requests_are_quarantined_unless_all_are(store: Store) -> None:
    def answer(r: LLMRequest) -> LLMResponse:
        if r.messages[0]["content"] .startswith("too long"):
            return LLMResponse.failure("rejected", "BadRequestError 400: context length")
        return _echo(r)

    answers, bad = LLMRunner(ScriptedBackend(answer)).run([_request("too long"), _request("ok")])
    assert answers == [None, {"answer": "ok"}]
    assert len(bad) == 1 and bad[0].raw is None and "context length" in bad[0].reason
    with pytest.raises(LLMError, match="configuration"):
        LLMRunner(ScriptedBackend(answer)).run([_request("too long 1"), _request("too long 2")])


def test_non_live_backend_uses_no_cache(store: Store) -> None:
    class Rules(ScriptedBackend):
        name = "rules-like"
        live = False

    backend = Rules()
    runner = LLMRunner(backend, ResponseCache(store))
    runner.run([_request("a"), _request("a")])
    runner.run([_request("a")])
    assert [len(b) for b in backend.batches] == [2, 1] and store.read("llm_cache").num_rows == 0


def test_stats_add_and_check_helper() -> None:
    total = LLMStats(calls=1, tokens_in=2).add(LLMStats(calls=3, cache_hits=1))
    assert total.as_dict() == {"calls": 4, "tokens_in": 2, "tokens_out": 0, "cache_hits": 1, "retries": 0,
                               "quarantined": 0}
    assert check('```json\n{"answer": "x"}\n```', SCHEMA) == ({"answer": "x"}, None)
    assert check(None, SCHEMA)[1] == "empty answer"
    assert "schema violation" in (check('{"answer": 3}', SCHEMA)[1] or "")
    assert check("[" * 5000, SCHEMA) == (None, "not valid JSON: nested too deeply")   # not a RecursionError
