"""The service's limits on a real uvicorn server on loopback: no key means 401 before any body byte
is read, bodies over the limit (chunked or not) are refused while they stream, and out-of-range or
meaningless fields are 422, never 500 nor a silent default."""
from __future__ import annotations

import json
from typing import Any, Callable, ContextManager, Iterator

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from memory.embed import Embedder
from retrieval import RetrievalSettings, Retriever
from retrieval.feedback import read_feedback
from retrieval.service import create_app
from tests.helpers import messages_store

KEY = "limits-key-1"
MAX_QUERY = 200
LIMIT = MAX_QUERY * 12 + 8192         # the service's body limit for this max_query_chars
CHUNK = b"x" * (1 << 16)
HUGE = 4096                           # chunks: a 256 MiB body, generated lazily


class Spy:
    """ASGI wrapper around the app: counts the body bytes the server handed it and the status sent."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.received = 0
        self.status: int | None = None

    def reset(self) -> None:
        self.received, self.status = 0, None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counting() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                self.received += len(message.get("body", b""))
            return message

        async def noting(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.status = message["status"]
            await send(message)

        await self.app(scope, counting, noting)


class Body:
    """A chunked request body of `chunks` × 64 KiB, generated as it is sent; `sent` counts bytes."""

    def __init__(self, chunks: int) -> None:
        self.chunks = chunks
        self.sent = 0

    def __iter__(self) -> Iterator[bytes]:
        for _ in range(self.chunks):
            self.sent += len(CHUNK)
            yield CHUNK


@pytest.fixture(scope="module")
def retriever(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> Retriever:
    st = messages_store(tmp_path_factory.mktemp("limits") / "store", embedder, "eve",
                        ["I adopted a puppy named Biscuit", "I work as a nurse in Boston"])
    return Retriever(st, RetrievalSettings(api_key=KEY, max_query_chars=MAX_QUERY, refresh_ms=0), embedder=embedder)


@pytest.fixture(scope="module")
def spy(retriever: Retriever) -> Spy:
    return Spy(create_app(retriever))


@pytest.fixture(scope="module")
def url(spy: Spy, serve_app: Callable[..., ContextManager[str]]) -> Iterator[str]:
    with serve_app(spy) as base:
        yield base


@pytest.fixture
def client(url: str, spy: Spy) -> Iterator[httpx.Client]:
    spy.reset()
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as c:
        yield c


def _post_chunked(url: str, body: Body, headers: dict[str, str]) -> httpx.Response:
    # a fresh connection per huge body: the server closes the connection of a refused request
    with httpx.Client(base_url=url, timeout=30) as c:
        return c.post("/v1/users/eve/retrieve", content=body,
                      headers={"content-type": "application/json", **headers})


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}])
def test_no_key_is_refused_before_the_body_is_read(url: str, spy: Spy, headers: dict[str, str]) -> None:
    spy.reset()
    body = Body(HUGE)
    res = _post_chunked(url, body, headers)
    assert res.status_code == 401 and res.headers["www-authenticate"] == "Bearer"
    assert spy.received == 0, "the body was read before authentication"
    assert body.sent < HUGE * len(CHUNK) // 8, f"the server took {body.sent} bytes of a refused body"


def test_oversize_chunked_body_is_refused_while_streaming(url: str, spy: Spy) -> None:
    spy.reset()
    body = Body(HUGE)
    res = _post_chunked(url, body, {"Authorization": f"Bearer {KEY}"})
    assert res.status_code == 413 and f"over {LIMIT} bytes" in res.json()["detail"]
    assert spy.received <= LIMIT + 2 * len(CHUNK), f"the server buffered {spy.received} bytes"
    assert body.sent < HUGE * len(CHUNK) // 8, f"the server took {body.sent} bytes of a refused body"


def test_declared_oversize_body_and_small_chunked_body(client: httpx.Client, spy: Spy) -> None:
    big = client.post("/v1/users/eve/retrieve", content=b"x" * (LIMIT + 1),
                      headers={"content-type": "application/json"})
    assert big.status_code == 413 and spy.received == 0          # refused on its Content-Length
    ok = client.post("/v1/users/eve/retrieve", content=iter([b'{"query": "what is my ', b'dog called?", "k": 1}']),
                     headers={"content-type": "application/json"})
    assert ok.status_code == 200, ok.text
    assert "Biscuit" in ok.json()["items"][0]["text"]


def test_public_paths_need_no_key(url: str) -> None:
    assert httpx.get(f"{url}/healthz").status_code == 200
    assert httpx.get(f"{url}/openapi.json").status_code == 200
    assert httpx.get(f"{url}/v1/nothing-here").status_code == 401       # unknown paths are not public


@pytest.mark.parametrize("version", [2**63, -1, 10**30, "x", True, "3"])   # as the Python call refuses
def test_reranker_version_out_of_range_is_422(client: httpx.Client, retriever: Retriever, version: Any) -> None:
    before = read_feedback(retriever.store).num_rows
    res = client.post("/v1/users/eve/feedback", json={"query": "dog", "shown_ids": ["eve-m0"],
                                                      "reranker_version": version})
    assert res.status_code == 422, res.text
    assert read_feedback(retriever.store).num_rows == before


def test_reranker_version_in_range_is_stored(client: httpx.Client, retriever: Retriever) -> None:
    res = client.post("/v1/users/eve/feedback", json={"query": "dog", "shown_ids": ["eve-m0"],
                                                      "reranker_version": 2**63 - 1})
    assert res.status_code == 200, res.text
    rows = read_feedback(retriever.store, "eve").to_pylist()
    assert [r["reranker_version"] for r in rows] == [2**63 - 1]


@pytest.mark.parametrize("path", ["retrieve", "context"])
@pytest.mark.parametrize("body,match", [
    ({"query": "   \t\n "}, "blank"),
    ({"query": "dog", "strategy": ""}, "unknown retrieval strategy"),
    ({"query": "dog", "kinds": ["fragments"]}, "known: message, fragment, insight, topic, summary"),
    ({"query": "dog", "kinds": []}, "kinds is empty"),
])
def test_meaningless_fields_are_422(client: httpx.Client, path: str, body: dict[str, Any], match: str) -> None:
    res = client.post(f"/v1/users/eve/{path}", json=body)
    assert res.status_code == 422 and match in str(res.json()["detail"]), res.text


@pytest.mark.parametrize("path", ["retrieve", "context", "feedback"])
def test_a_lone_surrogate_is_422_not_500(client: httpx.Client, path: str) -> None:
    """Not valid Unicode text: refused with the field named (FastAPI's own handler echoed the input
    back and failed to encode it)."""
    raw = '{"query": "guitar \\ud800", "shown_ids": ["x"]}'
    res = client.post(f"/v1/users/alice/{path}", content=raw, headers={"content-type": "application/json"})
    assert res.status_code == 422 and res.json()["detail"][0]["loc"] == ["body", "query"], res.text


def test_blank_feedback_query_is_422(client: httpx.Client) -> None:
    res = client.post("/v1/users/eve/feedback", json={"query": "  ", "shown_ids": ["eve-m0"]})
    assert res.status_code == 422 and "blank" in str(res.json()["detail"])


def test_valid_requests_are_unchanged(client: httpx.Client) -> None:
    plain = client.post("/v1/users/eve/retrieve", json={"query": "dog", "k": 2}).json()
    default = client.post("/v1/users/eve/retrieve", json={"query": "dog", "k": 2, "strategy": None,
                                                          "kinds": None}).json()
    assert [i["id"] for i in plain["items"]] == [i["id"] for i in default["items"]]
    assert plain["strategy"] == "rfmem-hybrid"
    only = client.post("/v1/users/eve/retrieve", json={"query": "dog", "kinds": ["message"]})
    assert only.status_code == 200 and {i["kind"] for i in only.json()["items"]} == {"message"}
    assert client.post("/v1/users/eve/retrieve", json={"query": "x" * (MAX_QUERY + 1)}).status_code == 413


def test_a_query_within_the_limit_is_no_oversize_body_when_json_escapes_it(
        retriever: Retriever, serve_app: Callable[..., ContextManager[str]]) -> None:
    """Python's json escapes non-ASCII by default: an emoji takes 12 bytes of body, and a query of
    `max_query_chars` emoji must still be served (the body limit was 4 bytes a character)."""
    chars = 2000
    wide = Retriever(retriever.store, RetrievalSettings(api_key=KEY, max_query_chars=chars, refresh_ms=0),
                     embedder=retriever.embedder)
    body = json.dumps({"query": "\U0001F3B8" * chars, "k": 1}, ensure_ascii=True)
    assert len(body) > chars * 4 + 8192
    with serve_app(create_app(wide)) as base:
        res = httpx.post(f"{base}/v1/users/eve/retrieve", content=body, timeout=60,
                         headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert res.status_code == 200, res.text
