"""The HTTP service on a real uvicorn server on loopback, called with httpx."""
from __future__ import annotations

from typing import Any, Callable, ContextManager, Iterator

import httpx
import pytest

from memory.embed import Embedder
from memory.errors import RunInProgressError
from memory.store import Store
from retrieval import RetrievalSettings, Retriever
from retrieval.service import RETRY_AFTER_BUSY_S, RETRY_AFTER_RUN_S, create_app
from tests.helpers import messages_store

KEY = "test-key-123"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> Store:
    return messages_store(tmp_path_factory.mktemp("svc") / "store", embedder, "eve",
                          ["I adopted a puppy named Biscuit", "I work as a nurse in Boston",
                           "I love jazz and play the sax"])


@pytest.fixture(scope="module")
def url(store: Store, embedder: Embedder, serve_app: Callable[[Any], ContextManager[str]]) -> Iterator[str]:
    r = Retriever(store, RetrievalSettings(api_key=KEY, max_query_chars=200), embedder=embedder)
    with serve_app(create_app(r)) as base:
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as c:
        yield c


def test_healthz_and_docs_need_no_key(url: str) -> None:
    health = httpx.get(f"{url}/healthz").json()
    assert health["status"] == "ok" and "store" not in health
    spec = httpx.get(f"{url}/openapi.json").json()
    assert "/v1/users/{user_id}/retrieve" in spec["paths"] and "/v1/users/{user_id}/context" in spec["paths"]
    assert httpx.get(f"{url}/docs").status_code == 200


def test_retrieve(client: httpx.Client) -> None:
    res = client.post("/v1/users/eve/retrieve", json={"query": "what is my dog's name?", "k": 2,
                                                      "strategy": "rfmem"})
    assert res.status_code == 200, res.text
    data = res.json()
    assert len(data["items"]) == 2 and "Biscuit" in data["items"][0]["text"]
    assert data["route"] in ("familiarity", "recollection") and "timings" in data["signals"]
    assert data["items"][0]["source_ids"] == ["D1:0"]


def test_context(client: httpx.Client) -> None:
    data = client.post("/v1/users/eve/context", json={"query": "job", "max_tokens": 60}).json()
    assert data["context"].startswith("Memories") and "nurse" in data["context"] and data["item_ids"]


def test_auth_required(url: str) -> None:
    body = {"query": "dog"}
    assert httpx.post(f"{url}/v1/users/eve/retrieve", json=body).status_code == 401
    bad = httpx.post(f"{url}/v1/users/eve/retrieve", json=body, headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and bad.headers["www-authenticate"] == "Bearer"


def test_errors(client: httpx.Client) -> None:
    unknown = client.post("/v1/users/nobody/retrieve", json={"query": "dog"})
    assert unknown.status_code == 200 and unknown.json()["items"] == []
    bad_user = client.post("/v1/users/bad%20user'/retrieve", json={"query": "dog"})
    assert bad_user.status_code == 422 and "invalid user id" in bad_user.json()["detail"]
    newline = client.post("/v1/users/alice%0A/retrieve", json={"query": "dog"})   # `alice\n`
    assert newline.status_code == 422 and "invalid user id" in newline.json()["detail"]
    assert client.post("/v1/users/eve/retrieve", json={"k": 3}).status_code == 422
    assert client.post("/v1/users/eve/retrieve", json={"query": "dog", "k": 0}).status_code == 422
    assert client.post("/v1/users/eve/retrieve", content=b"not json",
                       headers={"content-type": "application/json"}).status_code == 422
    strat = client.post("/v1/users/eve/retrieve", json={"query": "dog", "strategy": "magic"})
    assert strat.status_code == 422 and "unknown retrieval strategy" in strat.json()["detail"]
    assert client.post("/v1/users/eve/retrieve", json={"query": "x" * 201}).status_code == 413
    assert client.post("/v1/users/eve/retrieve", json={"query": "x" * 100_000}).status_code == 413


def test_k_and_max_tokens_are_json_integers(client: httpx.Client) -> None:
    """true, 2.0 and "3" are no k (nor a token budget): 422, not coerced to 1, 2 and 3."""
    for k in (True, False, 2.0, "3", 2.5):
        res = client.post("/v1/users/eve/retrieve", json={"query": "dog", "k": k})
        assert res.status_code == 422 and res.json()["detail"][0]["loc"] == ["body", "k"], (k, res.text)
    assert client.post("/v1/users/eve/retrieve", json={"query": "dog", "k": 2}).json()["k"] == 2
    for budget in (True, "60", 60.0):
        assert client.post("/v1/users/eve/context", json={"query": "job", "max_tokens": budget}).status_code == 422


def test_a_write_on_a_busy_store_gets_503_with_retry_after(client: httpx.Client, store: Store) -> None:
    """Feedback while another writer holds the store's write lease past the wait: 503 + Retry-After,
    and the same request goes through once the lease is free (it is safe to retry as it is)."""
    shown = client.post("/v1/users/eve/retrieve", json={"query": "dog", "k": 1}).json()["items"]
    body = {"query": "dog", "shown_ids": [shown[0]["id"]], "cited_ids": [shown[0]["id"]]}
    wait, store.write_lease_wait_s = store.write_lease_wait_s, 0.2
    try:
        with store.write_lease():          # held by this thread; the server's threads must wait
            busy = client.post("/v1/users/eve/feedback", json=body)
        assert busy.status_code == 503 and busy.headers["retry-after"] == str(RETRY_AFTER_BUSY_S)
        assert "busy" in busy.json()["detail"]
        assert client.post("/v1/users/eve/feedback", json=body).status_code == 200
    finally:
        store.write_lease_wait_s = wait


def test_a_write_during_a_run_gets_409_with_retry_after(embedder: Embedder, store: Store,
                                                        serve_app: Callable[[Any], ContextManager[str]]) -> None:
    """A write route that refuses to run during a consolidation (`RunInProgressError`) answers 409."""
    app = create_app(Retriever(store, RetrievalSettings(), embedder=embedder))

    @app.post("/v1/users/{user_id}/needs-no-run")
    def needs_no_run(user_id: str) -> None:
        raise RunInProgressError("skipped: a consolidation run is still in progress on store x")

    with serve_app(app) as base:
        res = httpx.post(f"{base}/v1/users/eve/needs-no-run")
    assert res.status_code == 409 and res.headers["retry-after"] == str(RETRY_AFTER_RUN_S)
    assert "still in progress" in res.json()["detail"]
