"""Pending work survives a run: quarantined LLM work is retried (up to a cap) and its quarantine rows
cleared once it succeeds; messages appended to a consolidated session and sessions dated before the
watermark are consolidated; a run with nothing new does nothing. Real LanceDB, real embedder, the
`rules` backend (and a variant of it that fails chosen requests)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from memory.ingest import ingest
from memory.llm.base import LLMRequest, LLMResponse, RulesAnswers, register_backend
from memory.read import PROFILE_KEY
from memory.runs import RunReport, consolidate, open_store
from memory.settings import Settings
from memory.store import Store
from retrieval import Retriever
from tests.helpers import SAMPLE, unique_ids

#: (task, session id or user id) whose answers `_Failing` breaks; set by the `failing` fixture
FAILING: set[tuple[str, str]] = set()


@register_backend("fails-chosen")
class _Failing(RulesAnswers):
    """Answers like `rules`, except malformed JSON (the re-ask too) for the chosen requests."""

    name = "fails-chosen"
    live = False
    default_model = "fails-chosen-v1"

    def answer(self, request: LLMRequest, answer: LLMResponse, index: int) -> LLMResponse:
        return LLMResponse(text='{"broken": [ oops') if _chosen(request) else answer


def _chosen(request: LLMRequest) -> bool:
    c = request.context
    return (request.task, c.get("session_id") or c.get("user_id")) in FAILING


@pytest.fixture
def failing() -> Iterator[set[tuple[str, str]]]:
    FAILING.clear()
    yield FAILING
    FAILING.clear()


def _ingested(root: Path) -> Store:
    store = open_store(Settings(store=str(root)))
    ingest(store, SAMPLE, "jsonl")
    return store


def _run(store: Store, llm: str = "rules", **kw: Any) -> RunReport:
    return consolidate(store, Settings(store=store.uri, llm=llm, **kw))


def _rows(store: Store, table: str, **match: Any) -> list[dict[str, Any]]:
    return [r for r in store.read(table).to_pylist() if all(r[k] == v for k, v in match.items())]


def _progress(store: Store, session_id: str | None) -> dict[str, Any]:
    [row] = [r for r in store.read("progress", "alice").to_pylist() if r["session_id"] == session_id]
    return row


def _append(store: Store, tmp_path: Path, rows: list[dict[str, str]]) -> None:
    path = tmp_path / f"more-{len(list(tmp_path.glob('more-*')))}.jsonl"
    path.write_text("".join(json.dumps({"user_id": "alice", **r}) + "\n" for r in rows))
    ingest(store, path, "jsonl")


APPENDED = [
    {"session_id": "alice-s1", "message_id": "alice-s1-m09", "speaker": "Alice",
     "text": "Oh, and I adopted a grey kitten named Pepper from the shelter on Elm Street.",
     "timestamp": "2024-03-02T10:40:00Z"},
    {"session_id": "alice-s1", "message_id": "alice-s1-m10", "speaker": "Alice",
     "text": "I love baking sourdough bread every Sunday morning with my grandmother's old recipe.",
     "timestamp": "2024-03-02T10:42:00Z"},
]
LATE = [
    {"session_id": "alice-s0", "message_id": "alice-s0-m01", "speaker": "Alice",
     "text": "I just moved to Oakland and I started running along Lake Merritt every evening.",
     "timestamp": "2024-02-10T09:00:00Z"},
    {"session_id": "alice-s0", "message_id": "alice-s0-m02", "speaker": "assistant",
     "text": "Welcome to Oakland! How far do you run?", "timestamp": "2024-02-10T09:02:00Z"},
    {"session_id": "alice-s0", "message_id": "alice-s0-m03", "speaker": "Alice",
     "text": "I run about five kilometers, and my goal is to finish a half marathon in the autumn.",
     "timestamp": "2024-02-10T09:04:00Z"},
]


# -- (a) quarantined work is retried, then cleared ---------------------------------------------------
def test_quarantined_extraction_is_retried_and_cleared(tmp_path: Path, failing: set[tuple[str, str]],
                                                      consolidated_sample: tuple[Path, RunReport]) -> None:
    store = _ingested(tmp_path / "store")
    failing.add(("extract", "alice-s2"))
    first = _run(store, "fails-chosen")
    assert first.status == "quarantined"
    assert first.outcome["pending"] == 1 and "1 sessions pending retry" in first.summary()
    assert not _rows(store, "fragments", session_id="alice-s2")
    assert len(_rows(store, "quarantine", stage="extract", source="alice-s2")) == 1
    assert _progress(store, "alice-s2")["status"] == "pending"

    second = _run(store)  # a working model
    assert second.status == "completed"
    assert second.counts["sessions"] == 1 and second.counts["messages"] == 0  # its messages kept their vectors
    assert second.outcome == {"pending": 0, "given_up": 0, "retried": 1, "recovered": 1}
    clean = open_store(Settings(store=str(consolidated_sample[0])))
    want = {r["id"] for r in _rows(clean, "fragments", session_id="alice-s2")}
    assert want and {r["id"] for r in _rows(store, "fragments", session_id="alice-s2")} == want
    assert _rows(store, "topics", session_id="alice-s2")
    assert not _rows(store, "quarantine", source="alice-s2")
    assert _progress(store, "alice-s2")["status"] == "done"
    assert _run(store).counts["sessions"] == 0
    unique_ids(store)


def test_retry_cap_gives_up(tmp_path: Path, failing: set[tuple[str, str]]) -> None:
    store = _ingested(tmp_path / "store")
    failing.add(("extract", "alice-s2"))
    reports = [_run(store, "fails-chosen") for _ in range(3)]  # max_llm_attempts = 3 by default
    assert [r.outcome["pending"] for r in reports] == [1, 1, 0]
    assert [r.outcome["given_up"] for r in reports] == [0, 0, 1]
    assert reports[1].counts["sessions"] == reports[2].counts["sessions"] == 1
    assert reports[2].status == "quarantined" and "1 given up" in reports[2].summary()
    row = _progress(store, "alice-s2")
    assert row["status"] == "given_up" and json.loads(row["pending_json"])[0]["attempts"] == 3
    later = _run(store, "fails-chosen")
    assert later.counts["sessions"] == 0 and later.llm.get("calls", 0) == 0 and later.status == "completed"
    assert len(_rows(store, "quarantine", stage="extract", source="alice-s2")) == 1  # the loss stays on record

    capped = _ingested(tmp_path / "capped")  # the cap is a setting
    assert _run(capped, "fails-chosen", max_llm_attempts=1).outcome["given_up"] == 1
    assert _run(capped, "fails-chosen", max_llm_attempts=1).counts["sessions"] == 0


def test_quarantined_topics_and_profile_are_retried(tmp_path: Path, failing: set[tuple[str, str]]) -> None:
    store = _ingested(tmp_path / "store")
    failing.update({("topics", "alice-s3"), ("profile", "alice")})
    first = _run(store, "fails-chosen")
    assert first.status == "quarantined" and first.outcome["pending"] == 2  # alice-s3's topics, alice's profile
    assert _rows(store, "fragments", session_id="alice-s3") and not _rows(store, "topics", session_id="alice-s3")
    assert not _rows(store, "summaries", user_id="alice", key=PROFILE_KEY)
    pending = json.loads(_progress(store, "alice-s3")["pending_json"])
    assert {i["work"] for i in pending} == {"topics"}
    fragments = {r["id"] for r in store.read("fragments").to_pylist()}

    second = _run(store)
    assert second.status == "completed" and second.outcome["recovered"] == 2
    assert second.counts["fragments"] == 0  # only the topic requests and the profile were asked again
    assert {r["id"] for r in store.read("fragments").to_pylist()} == fragments
    assert _rows(store, "topics", session_id="alice-s3")
    assert _rows(store, "summaries", user_id="alice", key=PROFILE_KEY)
    assert not [q for q in store.read("quarantine").to_pylist() if q["user_id"] == "alice"]
    assert _run(store).counts["sessions"] == 0
    unique_ids(store)


def test_quarantined_reasoning_is_retried(tmp_path: Path, failing: set[tuple[str, str]],
                                          consolidated_sample: tuple[Path, RunReport]) -> None:
    """A linked pair whose reason answer is quarantined stays pending on its session; the next run asks
    only those pairs again (no message, fragment or topic work) and ends with the clean run's insights."""
    store = _ingested(tmp_path / "store")
    failing.add(("reason", "alice"))
    first = _run(store, "fails-chosen")
    assert first.status == "quarantined" and first.outcome["pending"] >= 1
    assert not _rows(store, "insights", user_id="alice")
    held = _rows(store, "quarantine", stage="reason")
    pending = [i for r in store.read("progress", "alice").to_pylist()
               for i in json.loads(r["pending_json"] or "[]")]
    assert pending and {i["work"] for i in pending} == {"reason"}
    assert {i["subject"] for i in pending} == {q["source"] for q in held}        # one item per link id
    fragments = {r["id"] for r in store.read("fragments").to_pylist()}

    second = _run(store)
    assert second.status == "completed" and second.outcome["recovered"] == first.outcome["pending"]
    assert second.counts["messages"] == second.counts["fragments"] == 0
    assert second.counts["links"] == len(held)
    assert {r["id"] for r in store.read("fragments").to_pylist()} == fragments
    clean = open_store(Settings(store=str(consolidated_sample[0])))
    want = {r["id"] for r in _rows(clean, "insights", user_id="alice")}
    assert want and {r["id"] for r in _rows(store, "insights", user_id="alice")} == want
    assert {r["node_id"] for r in _rows(store, "graph_nodes", user_id="alice", kind="insight")} == want
    assert not _rows(store, "quarantine", stage="reason")
    assert _run(store).counts["sessions"] == 0
    unique_ids(store)


def test_a_late_sessions_pending_link_stays_on_it_when_the_later_side_reopens(
        tmp_path: Path, failing: set[tuple[str, str]]) -> None:
    """A late session's links to later sessions' clusters are pending on the late session; a retry
    quarantined again stays there (one more attempt), even when the later session is in the shard too."""
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["user_id"] == "alice"]
    on_time, late = tmp_path / "on_time.jsonl", tmp_path / "late.jsonl"
    on_time.write_text("".join(json.dumps(r) + "\n" for r in rows if r["session_id"] != "alice-s2"))
    late.write_text("".join(json.dumps(r) + "\n" for r in rows if r["session_id"] == "alice-s2"))
    store = open_store(Settings(store=str(tmp_path / "store")))
    ingest(store, on_time, "jsonl")
    _run(store)
    ingest(store, late, "jsonl")
    failing.add(("reason", "alice"))
    _run(store, "fails-chosen")
    links = {r["id"]: r["session_id"] for r in store.read("links", "alice").to_pylist()}

    def pending() -> dict[str, tuple[str, int]]:
        return {i["subject"]: (r["session_id"], i["attempts"]) for r in store.read("progress", "alice").to_pylist()
                for i in json.loads(r["pending_json"] or "[]")}

    later = {k: v for k, v in pending().items() if links[k] != "alice-s2"}   # new side: a later session
    assert later and all(sid == "alice-s2" and n == 1 for sid, n in later.values())
    _append(store, tmp_path, [{"session_id": links[next(iter(later))], "message_id": "alice-late-m99",
                               "speaker": "Alice", "text": "By the way, I also started learning Spanish.",
                               "timestamp": "2024-03-30T23:59:00Z"}])
    _run(store, "fails-chosen")
    assert {k: pending()[k] for k in later} == {k: ("alice-s2", 2) for k in later}


# -- (b) messages appended to a consolidated session ---------------------------------------------------
def test_appended_messages_are_consolidated_and_retrievable(sample_store: Store, tmp_path: Path) -> None:
    store = sample_store
    before = {r["id"] for r in store.read("fragments").to_pylist()}
    _append(store, tmp_path, APPENDED)
    report = _run(store)
    assert report.counts["sessions"] == 1 and report.counts["messages"] == 2
    new_ids = {"alice-s1-m09", "alice-s1-m10"}
    msgs = [r for r in store.read("messages", "alice").to_pylist() if r["message_id"] in new_ids]
    assert len(msgs) == 2 and all(m["vector"] is not None for m in msgs)
    frags = [r for r in store.read("fragments", "alice").to_pylist() if r["id"] not in before]
    assert frags and all(set(f["source_ids"]) <= new_ids for f in frags)  # only the new messages extracted
    assert before <= {r["id"] for r in store.read("fragments").to_pylist()}
    unique_ids(store)

    r = Retriever.open(store.uri)
    items = r.retrieve("alice", "What is the name of Alice's kitten?", k=5).items
    assert any("alice-s1-m09" in it.source_ids for it in items), [it.text for it in items]
    assert _run(store).counts["sessions"] == 0


# -- (c) a session dated before the watermark -----------------------------------------------------------
def test_late_session_is_consolidated(sample_store: Store, tmp_path: Path) -> None:
    store = sample_store
    [mark] = store.read("watermarks", "alice").to_pylist()
    _append(store, tmp_path, LATE)
    report = _run(store)
    assert report.counts["sessions"] == 1 and report.counts["messages"] == 3
    assert _rows(store, "fragments", session_id="alice-s0")
    assert all(m["vector"] is not None for m in _rows(store, "messages", session_id="alice-s0"))
    [after] = store.read("watermarks", "alice").to_pylist()
    assert after["last_session_ts"] == mark["last_session_ts"]
    assert after["sessions_done"] == mark["sessions_done"] + 1
    graph = {r["node_id"] for r in store.read("graph_nodes", "alice").to_pylist()}
    assert {r["id"] for r in _rows(store, "fragments", session_id="alice-s0")} <= graph
    assert _run(store).counts["sessions"] == 0
    unique_ids(store)


# -- (d) nothing new, nothing done ----------------------------------------------------------------------
def test_run_with_nothing_new_does_nothing(sample_store: Store, tmp_path: Path, store_reads: list[str]) -> None:
    store = sample_store
    _append(store, tmp_path, APPENDED + LATE)
    assert _run(store).counts["sessions"] == 2
    versions = {name: store.version(name) for name in store.table_names() if name != "runs"}
    store_reads.clear()
    again = _run(store)
    assert again.counts["sessions"] == 0 and again.llm.get("calls", 0) == 0 and again.status == "completed"
    assert {name: store.version(name) for name in versions} == versions
    # `units`: the runs row's write checks for a unit left open by a dead writer (memory.units);
    # `runs`: the forgets a crash left `started`, finished before the run plans (memory.nightly)
    assert set(store_reads) <= {"watermarks", "sessions", "progress", "messages", "units", "runs"}
    assert store_reads.count("messages") <= 1  # `plan_shards` lists the users; no user's messages are read


# -- a store consolidated before progress was tracked ---------------------------------------------------
def test_store_from_before_progress_is_migrated(tmp_path: Path, failing: set[tuple[str, str]]) -> None:
    store = _ingested(tmp_path / "store")
    failing.add(("extract", "alice-s2"))
    _run(store, "fails-chosen")
    store.drop_table("progress")  # what an older mnemo left: a watermark, no progress rows
    _append(store, tmp_path, APPENDED + LATE)
    fragments = {r["id"] for r in store.read("fragments").to_pylist()}
    report = _run(store)
    assert report.counts["sessions"] == 3  # the quarantined, the appended and the late session
    assert report.counts["messages"] == 5 and report.outcome["recovered"] == 1
    for sid in ("alice-s0", "alice-s2"):
        assert _rows(store, "fragments", session_id=sid)
    assert fragments <= {r["id"] for r in store.read("fragments").to_pylist()}
    assert not _rows(store, "quarantine", source="alice-s2")
    assert {r["status"] for r in store.read("progress").to_pylist()} == {"done"}
    assert _run(store).counts["sessions"] == 0
    unique_ids(store)

