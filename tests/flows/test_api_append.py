"""POST /v1/users/{user_id}/messages on a real uvicorn server on loopback (flows.service's whole app):
counts and quarantine reasons, idempotent re-sends, 413 / 422 / 401, its own body limit, 503 after the
service's short write wait (in the append worker process and in the serving one), and the appended
turns retrievable over HTTP after the next consolidation."""
from __future__ import annotations

import json
import time
from typing import Any, Callable, ContextManager, Iterator

import httpx
import pytest

from flows.api_append import MAX_TURN_DEPTH
from flows.service import configure_writes, create_app
from memory.embed import Embedder
from memory.ingest import REUSED_ID
from memory.lease import write_lease
from memory.runs import consolidate
from memory.settings import RetrievalSettings, Settings
from memory.store import Store
from retrieval import Retriever
from retrieval.guard import open_without_key

KEY = "append-key"


def turns(n: int, session: str = "alice-live", start: int = 0, text: str = "Alice note {i}: I planted tomatoes.") \
        -> list[dict[str, Any]]:
    return [{"session_id": session, "message_id": f"{session}-{i}", "role": "Alice", "text": text.format(i=i),
             "timestamp": f"2024-06-01T10:{i % 60:02d}:00Z"} for i in range(start, start + n)]


@pytest.fixture
def served(sample_store: Store, embedder: Embedder,
           serve_app: Callable[..., ContextManager[str]]) -> Iterator[tuple[str, Store]]:
    settings = Settings(store=sample_store.uri, retrieval=RetrievalSettings(
        api_key=KEY, append_max_messages=50, append_max_bytes=64 * 1024))
    r = Retriever(sample_store, settings, embedder=embedder)
    with serve_app(create_app(r), access_log=False) as url:
        yield url, sample_store


def test_append_route(served: tuple[str, Store]) -> None:
    url, store = served
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as c:
        body = {"messages": turns(3) + [{"session_id": "x", "message_id": "y", "speaker": "z", "text": "t",
                                         "timestamp": "yesterday"}]}
        res = c.post("/v1/users/alice/messages", json=body)
        assert res.status_code == 200, res.text
        data = res.json()
        assert (data["received"], data["added"], data["duplicates"]) == (4, 3, 0)
        assert data["quarantined"] == [{"index": 3, "message_id": "y",
                                        "reason": "unparsable timestamp: 'yesterday'"}]
        again = c.post("/v1/users/alice/messages", json=body).json()
        assert (again["added"], again["duplicates"]) == (0, 3)
        lone = {"session_id": "x", "message_id": "m\ud800", "speaker": "z", "text": "t", "timestamp": "2024-01-01T00:00:00Z"}
        odd = c.post("/v1/users/alice/messages", content=json.dumps({"messages": [lone]}),
                     headers={"content-type": "application/json"})     # quarantined, and answered
        assert odd.status_code == 200 and odd.json()["quarantined"] == [
            {"index": 0, "message_id": "m\\ud800", "reason": "lone surrogate in message_id"}], odd.text
        clash = c.post("/v1/users/alice/messages", json={"messages": turns(1, text="other text {i}")}).json()
        assert clash["added"] == 0 and clash["quarantined"][0]["reason"] == REUSED_ID
        # its own body limit: ~40 KB is over the query routes' limit but fine here
        big = turns(20, session="alice-big", text="{i} " + "I walked along the river today. " * 60)
        assert c.post("/v1/users/alice/messages", json={"messages": big}).status_code == 200
        assert c.post("/v1/users/alice/retrieve", json={"query": "x" * 40_000}).status_code == 413
        assert c.post("/v1/users/alice/messages",
                      json={"messages": turns(40, text="{i} " + "z" * 2000)}).status_code == 413   # bytes
        too_many = c.post("/v1/users/alice/messages", json={"messages": turns(51, session="many")})
        assert too_many.status_code == 413 and "at most 50" in too_many.json()["detail"]
        malformed: list[Any] = [{"messages": []}, {"messages": "hi"}, {"turns": turns(1)}, [1, 2]]
        for bad in malformed:
            assert c.post("/v1/users/alice/messages", json=bad).status_code == 422, bad
        assert c.post("/v1/users/alice/messages", content=b"{not json",
                      headers={"content-type": "application/json"}).status_code == 422
        assert c.post("/v1/users/a%20b/messages", json={"messages": turns(1)}).status_code == 422
    assert httpx.post(f"{url}/v1/users/alice/messages", json={"messages": turns(1)}).status_code == 401
    assert store.read("messages", "alice").num_rows == 34 + 3 + 20


def test_appended_turns_are_retrieved_after_consolidation(served: tuple[str, Store]) -> None:
    url, store = served
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as c:
        live = [{"session_id": "bob-live", "message_id": "bob-live-1", "speaker": "Bob",
                 "text": "My sister Priya is moving to Lisbon next month for a design job.",
                 "timestamp": "2024-06-02T09:00:00Z"}]
        assert c.post("/v1/users/bob/messages", json={"messages": live}).json()["added"] == 1
        consolidate(store, Settings(store=store.uri))
        res = c.post("/v1/users/bob/retrieve", json={"query": "Where is Bob's sister moving?", "k": 5}).json()
        assert any("bob-live-1" in it["source_ids"] for it in res["items"])


def deep(levels: int) -> bytes:
    """JSON text of `levels` nested lists."""
    return b"[" * levels + b"]" * levels


def posted(c: httpx.Client, path: str, body: bytes) -> httpx.Response:
    return c.post(path, content=body, headers={"content-type": "application/json"})


@pytest.mark.parametrize("in_worker", [True, False], ids=["worker-process", "serving-process"])
def test_a_turn_nested_too_deep_is_refused_422_naming_its_field(sample_store: Store, embedder: Embedder,
                                                                serve_app: Callable[..., ContextManager[str]],
                                                                in_worker: bool) -> None:
    settings = Settings(store=sample_store.uri, retrieval=RetrievalSettings(api_key=KEY, append_process=in_worker))
    r = Retriever(sample_store, settings, embedder=embedder)
    with serve_app(create_app(r, settings), access_log=False) as url, \
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as c:
        turn = json.dumps(turns(1, session="deep")[0]).encode()[:-1]       # without its closing brace
        # an unknown field 900 lists deep: it broke pickling the batch for the worker (500)
        res = posted(c, "/v1/users/alice/messages", b'{"messages": [' + turn + b', "x": ' + deep(900) + b"}]}")
        assert res.status_code == 422, res.text
        assert res.json()["detail"][0]["loc"] == ["body", "messages", 0, "x"]
        assert f"deeper than {MAX_TURN_DEPTH} levels" in res.json()["detail"][0]["msg"]
        res = posted(c, "/v1/users/alice/messages", b'{"messages": [{"session_id": "a"}, ' + deep(900) + b"]}")
        assert res.status_code == 422 and res.json()["detail"][0]["loc"] == ["body", "messages", 1], res.text
        # at the limit (the turn counts as one level) it is accepted, its unknown field kept in the raw row
        ok = posted(c, "/v1/users/alice/messages",
                    b'{"messages": [' + turn + b', "x": ' + deep(MAX_TURN_DEPTH - 1) + b"}]}")
        assert ok.status_code == 200 and ok.json()["added"] == 1, ok.text
        over = posted(c, "/v1/users/alice/messages",
                      b'{"messages": [' + turn + b', "x": ' + deep(MAX_TURN_DEPTH) + b"}]}")
        assert over.status_code == 422, over.text
        # the worker (and the service) still append
        assert c.post("/v1/users/alice/messages", json={"messages": turns(2, session="deep")}).json()["added"] == 1
        assert httpx.post(f"{url}/v1/users/alice/messages", content=deep(900)).status_code == 401   # the key first


def test_an_unparsable_body_answers_422_not_400(served: tuple[str, Store]) -> None:
    url, _ = served
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as c:
        for path in ("/v1/users/alice/messages", "/v1/users/alice/retrieve"):
            # nested deeper than the JSON parser goes (FastAPI's own answer: 400)
            res = posted(c, path, b'{"messages": [' + deep(5000) + b"]}")
            assert res.status_code == 422, res.text
            assert res.json()["detail"] == [{"type": "json_invalid", "loc": ["body"],
                                             "msg": "the body cannot be parsed as JSON: nested too deep"}]
            assert posted(c, path, b'{"messages": ["\xff"]}').status_code == 422      # not UTF-8
            assert posted(c, path, b"{not json").status_code == 422
        missing = c.post("/v1/users/alice/nothing-here", json={})
        assert missing.status_code == 404 and missing.json() == {"detail": "Not Found"}   # other codes unchanged
        assert c.post("/v1/users/alice/retrieve", json={"query": "x" * 40_000}).status_code == 413
    assert httpx.post(f"{url}/v1/users/alice/messages", content=deep(5000)).status_code == 401


@pytest.mark.parametrize("in_worker", [True, False], ids=["worker-process", "serving-process"])
def test_a_busy_store_answers_503_after_the_short_write_wait(sample_store: Store, embedder: Embedder,
                                                             serve_app: Callable[..., ContextManager[str]],
                                                             in_worker: bool) -> None:
    settings = Settings(store=sample_store.uri, retrieval=RetrievalSettings(write_wait_s=0.5,
                                                                            append_process=in_worker))
    r = Retriever(sample_store, settings, embedder=embedder)
    configure_writes(r, settings)                 # what `mnemo serve` does: the store's writes wait 0.5 s
    with serve_app(create_app(r, settings), access_log=False) as url, httpx.Client(base_url=url, timeout=60) as c:
        assert c.post("/v1/users/carl/messages", json={"messages": turns(1, session="carl")}).status_code == 200
        with write_lease(sample_store.uri, wait_s=5):   # another writer holds the lease
            start = time.perf_counter()
            res = c.post("/v1/users/carl/messages", json={"messages": turns(2, session="carl")})
            waited = time.perf_counter() - start
        assert res.status_code == 503 and res.headers["Retry-After"] == "2", res.text
        assert waited < 5, f"a refused append held its request {waited:.1f} s"
        again = c.post("/v1/users/carl/messages", json={"messages": turns(2, session="carl")}).json()
        assert (again["added"], again["duplicates"]) == (1, 1)


@pytest.mark.parametrize("host, keyed, warned", [
    ("127.0.0.1", False, False), ("localhost", False, False), ("::1", False, False), ("[::1]", False, False),
    ("0.0.0.0", False, True), ("10.1.2.3", False, True), ("my-host.example", False, True),
    ("0.0.0.0", True, False)])
def test_serving_beyond_loopback_without_a_key_is_warned(host: str, keyed: bool, warned: bool) -> None:
    warning = open_without_key(host, keyed)
    assert (warning is not None) == warned
    if warning:
        assert host in warning and "MNEMO_API_KEY" in warning
