"""Extraction answers are not lost in silence, and long sessions fit the answer's token limit:

- an answer whose items all cite ids the request does not show (or all carry an impossible date) is
  asked again once, then quarantined with its raw text, the session's extraction left pending for the
  next run; an id written as the prompt shows it ("[alice-s1-m01]") reads as the shown id;
- a session longer than `extract_window_messages` goes to a model in windows of consecutive messages,
  one request each, merged into the fragments one answer would give; a session that fits one window
  sends the request it always did, and a reopened session sends only its new messages.

Real LanceDB and embedder; fake backends that answer like `rules` and then spoil their answers."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from memory.errors import InvalidAnswerError
from memory.ingest import ingest
from memory.llm.base import LLMBackend, LLMRequest, LLMResponse, RulesAnswers, register_backend
from memory.llm.runner import LLMRunner
from memory.prompts import extract_request, parse_extraction
from memory.prompts.premem import validate_extraction
from memory.runs import RunReport, consolidate, open_store
from memory.settings import Settings
from memory.stages.extract import extraction_requests, shown_ids, windows
from memory.stages.load import load_shard
from memory.store import Store
from tests.helpers import SAMPLE, unique_ids

#: how `_Spoiling` spoils its extraction answers: "bracket", "invent", "date" or "" (not at all)
SPOIL: dict[str, str] = {"how": ""}
#: the extraction requests the fakes were sent, in order
SEEN: list[LLMRequest] = []

ALICE_S1 = [  # one session of one user, 4 personal messages
    {"session_id": "a-s1", "message_id": "a-s1-m1", "speaker": "Alice",
     "text": "I bought my first acoustic guitar yesterday, a Yamaha FG800.", "timestamp": "2024-03-02T10:15:00Z"},
    {"session_id": "a-s1", "message_id": "a-s1-m2", "speaker": "assistant",
     "text": "Congratulations! What made you start now?", "timestamp": "2024-03-02T10:16:00Z"},
    {"session_id": "a-s1", "message_id": "a-s1-m3", "speaker": "Alice",
     "text": "I have wanted to play since college and I finally have time on weekends.",
     "timestamp": "2024-03-02T10:17:00Z"},
    {"session_id": "a-s1", "message_id": "a-s1-m4", "speaker": "Alice",
     "text": "I live in Lisbon with my partner Joana and I work as a nurse.", "timestamp": "2024-03-02T10:18:00Z"},
]


def _spoil(answer: dict[str, Any], how: str) -> dict[str, Any]:
    for items in answer.values():
        for it in items:
            if how == "bracket":
                it["message_id"] = f"[{it['message_id']}]" if len(it["message_id"]) % 2 else f" [{it['message_id']}] "
            elif how == "invent":
                it["message_id"] = "msg-301"
            elif how == "date":
                it["date"] = "2024-02-30"
    return answer


@register_backend("spoiling-extract")
class _Spoiling(RulesAnswers):
    """Answers like `rules`, its extraction answers spoiled as `SPOIL` says (the re-ask's too)."""

    name = "spoiling-extract"
    live = False
    default_model = "spoiling-v1"

    def answer(self, request: LLMRequest, answer: LLMResponse, index: int) -> LLMResponse:
        if request.task != "extract":
            return answer
        SEEN.append(request)
        return LLMResponse(text=json.dumps(_spoil(json.loads(answer.text or "{}"), SPOIL["how"]))) \
            if SPOIL["how"] else answer


@register_backend("windowed-model")
class _Model(_Spoiling):
    """A model's stand-in (its answers go to the response cache), answering like `rules`."""

    name = "windowed-model"
    live = True
    default_model = "windowed-v1"


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    SPOIL["how"] = ""
    SEEN.clear()
    yield
    SPOIL["how"] = ""
    SEEN.clear()


def _archive(tmp_path: Path, rows: list[dict[str, str]], user: str = "alice") -> Path:
    path = tmp_path / f"part-{len(list(tmp_path.glob('part-*')))}.jsonl"
    path.write_text("".join(json.dumps({"user_id": user, **r}) + "\n" for r in rows))
    return path


def _store(root: Path, *archives: Path) -> Store:
    store = open_store(Settings(store=str(root)))
    for a in archives:
        ingest(store, a, "jsonl")
    return store


def _run(store: Store, llm: str, **kw: Any) -> RunReport:
    return consolidate(store, Settings(store=store.uri, llm=llm, **kw))


def _fragments(store: Store, **match: Any) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in store.read("fragments").to_pylist() if all(r[k] == v for k, v in match.items())}


def _extract_progress(store: Store, session_id: str) -> tuple[str, list[dict[str, Any]]]:
    [row] = [r for r in store.read("progress").to_pylist() if r["session_id"] == session_id]
    return row["status"], [i for i in json.loads(row["pending_json"] or "[]") if i["work"] == "extract"]


# -- defect 1: unusable answers -----------------------------------------------------------------------
@pytest.mark.parametrize("how", ["invent", "date"])
def test_an_answer_with_no_usable_item_is_reasked_then_quarantined_and_stays_pending(
        tmp_path: Path, how: str) -> None:
    store = _store(tmp_path / "store", _archive(tmp_path, ALICE_S1))
    SPOIL["how"] = how
    report = _run(store, "spoiling-extract")
    assert len(SEEN) == 2 and "previous answer was invalid" in SEEN[1].messages[-1]["content"]  # re-asked once
    assert report.llm["retries"] == 1 and report.status == "quarantined"
    [q] = [r for r in store.read("quarantine").to_pylist() if r["stage"] == "extract"]
    assert q["source"] == "a-s1" and "none of the" in q["reason"]
    assert ("msg-301" if how == "invent" else "2024-02-30") in q["raw"]          # the raw answer kept
    assert not _fragments(store)
    status, pending = _extract_progress(store, "a-s1")
    assert status == "pending" and pending and pending[0]["attempts"] == 1     # not marked done

    SPOIL["how"] = ""                                                           # the next run retries it
    SEEN.clear()
    again = _run(store, "spoiling-extract")
    assert len(SEEN) == 1 and again.outcome["recovered"] == 1 and again.status == "completed"
    assert _fragments(store, session_id="a-s1")
    assert _extract_progress(store, "a-s1") == ("done", [])
    assert not store.read("quarantine").to_pylist()
    unique_ids(store)


def test_bracketed_citations_read_as_the_shown_ids(tmp_path: Path) -> None:
    clean = _store(tmp_path / "clean", _archive(tmp_path, ALICE_S1))
    _run(clean, "spoiling-extract")
    want = _fragments(clean)
    SEEN.clear()
    store = _store(tmp_path / "store", _archive(tmp_path, ALICE_S1))
    SPOIL["how"] = "bracket"
    report = _run(store, "spoiling-extract")
    assert len(SEEN) == 1 and report.llm["retries"] == 0 and report.status == "completed"
    got = _fragments(store)
    assert want and got.keys() == want.keys()
    assert all(set(f["source_ids"]) <= {m["message_id"] for m in ALICE_S1} for f in got.values())


def test_validate_extraction_keeps_partly_good_and_empty_answers() -> None:
    ids = {"m1", "m2"}
    item = {"subject": "Alice", "key": "k", "value": "Lives in Lisbon", "message_id": "m1", "date": "2024-03-02"}
    empty = {"Factual_Information": [], "Experiential_Information": [], "Subjective_Information": []}
    validate_extraction(empty, ids)                                             # nothing personal: valid
    mixed = {**empty, "Factual_Information": [item, {**item, "message_id": "nope"}, {**item, "date": "2024-02-30"}]}
    validate_extraction(mixed, ids)
    assert [f["source_ids"] for f in parse_extraction(mixed, ids)] == [["m1"]]   # the bad ones dropped
    for bad in ({**item, "message_id": "nope"}, {**item, "date": "2023-13-01"}, {**item, "value": "  "}):
        with pytest.raises(InvalidAnswerError):
            validate_extraction({**empty, "Subjective_Information": [bad]}, ids)
    assert parse_extraction({**empty, "Factual_Information": [{**item, "message_id": " [m2] "}]}, ids)[0][
        "source_ids"] == ["m2"]
    assert not parse_extraction({**empty, "Factual_Information": [{**item, "message_id": "[m3]"}]}, ids)


def test_an_answer_citing_only_another_requests_messages_is_quarantined() -> None:
    def req(sid: str, mids: list[str]) -> LLMRequest:
        return extract_request({"user_id": "u", "session_id": sid, "participants": ["Alice"], "messages": [
            {"message_id": m, "speaker": "Alice", "text": "I live in Lisbon.", "ts": "2024-03-02T10:00:00"}
            for m in mids]})
    item = {"subject": "Alice", "key": "k", "value": "Lives in Lisbon", "message_id": "b1", "date": "2024-03-02"}
    answer = {"Factual_Information": [item], "Experiential_Information": [], "Subjective_Information": []}
    a, b = req("s-a", ["a1"]), req("s-b", ["b1"])

    class Same(LLMBackend):
        name, live, default_model = "same-answer", False, "same-v1"

        def complete(self, requests: list[LLMRequest]) -> list[LLMResponse]:
            return [LLMResponse(text=json.dumps(answer)) for _ in requests]

    answers, bad = LLMRunner(Same()).run([a, b], validate=lambda ans, r: validate_extraction(ans, shown_ids(r)))
    [q] = bad         # the runner checks each answer against its own request: a's is asked again, then set aside
    assert q.request is a and "b1" in (q.raw or "") and "b1" in q.reason and answers[1] == answer


# -- defect 2: windows ----------------------------------------------------------------------------
def test_windows_are_even_consecutive_and_keep_the_session() -> None:
    ctx = {"user_id": "u", "session_id": "s", "participants": ["A", "B"],
           "messages": [{"message_id": f"m{i}"} for i in range(25)]}
    parts = windows(ctx, 12)
    assert [len(p["messages"]) for p in parts] == [8, 8, 9]
    assert [m for p in parts for m in p["messages"]] == ctx["messages"]
    assert all(p["participants"] == ["A", "B"] and p["session_id"] == "s" for p in parts)
    assert windows(ctx, 25) == [ctx] and windows(ctx, None) == [ctx]


def test_a_session_that_fits_one_window_sends_the_same_request(tmp_path: Path) -> None:
    store = _store(tmp_path / "store", SAMPLE)
    sessions = load_shard(store, store.users(), "r").sessions
    longest = max(len(s.messages) for s in sessions)
    before = [extract_request(s.context()) for s in sessions]                  # what was always sent
    after = extraction_requests(sessions, longest)
    assert [r.cache_key("m") for r in after] == [r.cache_key("m") for r in before]
    assert len(extraction_requests(sessions, 3)) > len(sessions)


def test_a_long_session_goes_to_a_model_in_windows(tmp_path: Path,
                                                   consolidated_sample: tuple[Path, RunReport]) -> None:
    store = _store(tmp_path / "store", SAMPLE)
    report = _run(store, "windowed-model", extract_window_messages=3)
    sessions = load_shard(_store(tmp_path / "fresh", SAMPLE), ["alice", "bob"], "r").sessions
    assert len(SEEN) == sum(-(-len(s.messages) // 3) for s in sessions) > len(sessions)
    assert all(len(r.context["messages"]) <= 3 for r in SEEN)
    for s in sessions:                                   # each session's messages, once, in order
        shown = [m["message_id"] for r in SEEN if r.context["session_id"] == s.session_id
                 for m in r.context["messages"]]
        assert shown == [m["message_id"] for m in s.messages]
    assert report.status == "completed"
    rules = open_store(Settings(store=str(consolidated_sample[0])))
    assert _fragments(store).keys() == _fragments(rules).keys()          # merged as one answer's would be
    unique_ids(store)


def test_rules_reads_a_whole_session_whatever_the_window(tmp_path: Path,
                                                         consolidated_sample: tuple[Path, RunReport]) -> None:
    store = _store(tmp_path / "store", SAMPLE)
    _run(store, "rules", extract_window_messages=2)
    rules = open_store(Settings(store=str(consolidated_sample[0])))
    assert _fragments(store).keys() == _fragments(rules).keys()


def test_a_reopened_session_sends_only_its_new_messages_in_windows(tmp_path: Path) -> None:
    store = _store(tmp_path / "store", _archive(tmp_path, ALICE_S1))
    _run(store, "windowed-model", extract_window_messages=3)
    assert [len(r.context["messages"]) for r in SEEN] == [2, 2]
    more = [{**ALICE_S1[i % 4], "message_id": f"a-s1-m{5 + i}", "timestamp": f"2024-03-02T11:0{i}:00Z",
             "text": f"{ALICE_S1[i % 4]['text']} Also number {i}."} for i in range(5)]
    ingest(store, _archive(tmp_path, more), "jsonl")
    SEEN.clear()
    report = _run(store, "windowed-model", extract_window_messages=3)
    assert [[m["message_id"] for m in r.context["messages"]] for r in SEEN] == [
        ["a-s1-m5", "a-s1-m6"], ["a-s1-m7", "a-s1-m8", "a-s1-m9"]]
    assert report.status == "completed" and report.counts["fragments"] > 0
    unique_ids(store)
