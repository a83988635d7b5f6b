"""Citation feedback: validated, scoped to its user, idempotent; through the Python API and over
HTTP on a real uvicorn server."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Callable, ContextManager, Iterator

import httpx
import pytest

from memory.embed import Embedder
from memory.store import Store
from retrieval import RetrievalSettings, Retriever
from retrieval.feedback import InvalidFeedbackError, read_feedback
from retrieval.service import create_app


def _messages(user: str, texts: list[str], emb: Embedder) -> list[dict]:
    rows = [{"id": f"{user}-m{i}", "user_id": user, "session_id": f"{user}-s1", "message_id": f"{user}:D1:{i}",
             "seq": i, "speaker": user.title(), "text": t, "ts": datetime(2023, 3, i + 1, tzinfo=timezone.utc)}
            for i, t in enumerate(texts)]
    for r, v in zip(rows, emb.embed([f"{r['speaker']}: {r['text']}" for r in rows])):
        r["vector"] = v
    return rows


@pytest.fixture(scope="module")
def retriever(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> Retriever:
    st = Store(str(tmp_path_factory.mktemp("fb") / "store"), dim=embedder.dim)
    st.upsert("messages", _messages("eve", ["I adopted a puppy named Biscuit", "I work as a nurse in Boston",
                                            "I love jazz and play the sax"], embedder)
              + _messages("max", ["I collect vinyl records", "I live in Lisbon"], embedder))
    return Retriever(st, RetrievalSettings(refresh_ms=0, max_query_chars=200), embedder=embedder)


def test_feedback_is_stored_for_its_user(retriever: Retriever) -> None:
    res = retriever.retrieve("eve", "what pet do I have?", k=3, strategy="dense")
    shown = res.ids
    out = retriever.feedback("eve", "what pet do I have?", shown, shown[:1])
    assert out["shown"] == 3 and out["cited"] == 1
    rows = read_feedback(retriever.store, "eve").to_pylist()
    assert len(rows) == 1 and rows[0]["shown_ids"] == shown and rows[0]["cited_ids"] == shown[:1]
    assert len(rows[0]["query_vector"]) == retriever.store.dim
    assert read_feedback(retriever.store, "max").num_rows == 0
    retriever.feedback("eve", "what pet do I have?", shown, shown[:1])      # a retried POST
    again = read_feedback(retriever.store, "eve").to_pylist()
    # one row, still dated when first written: training reads what is newer than its last version
    assert len(again) == 1 and again[0]["created_at"] == rows[0]["created_at"]


@pytest.mark.parametrize("shown,cited,match", [
    (["max-m0"], [], "not retrievable for user eve"),          # another user's memory
    (["eve-m0", "nope"], [], "not retrievable"),               # unknown id
    (["eve-m0"], ["eve-m1"], "not shown"),                      # cited outside shown
    ([], [], "empty"),
    (["eve-m0", "eve-m0"], [], "repeat"),
])
def test_invalid_feedback_is_refused(retriever: Retriever, shown: list[str], cited: list[str], match: str) -> None:
    before = read_feedback(retriever.store).num_rows
    with pytest.raises(InvalidFeedbackError, match=match):
        retriever.feedback("eve", "anything", shown, cited)
    assert read_feedback(retriever.store).num_rows == before


@pytest.mark.parametrize("version", [2**63, -1, True, 1.5])
def test_reranker_version_out_of_range_is_refused(retriever: Retriever, version: Any) -> None:
    before = read_feedback(retriever.store).num_rows
    with pytest.raises(InvalidFeedbackError, match="reranker_version"):
        retriever.feedback("eve", "what pet do I have?", ["eve-m0"], [], reranker_version=version)
    assert read_feedback(retriever.store).num_rows == before
    with pytest.raises(InvalidFeedbackError, match="blank"):
        retriever.feedback("eve", " \n ", ["eve-m0"], [])


@pytest.fixture(scope="module")
def client(retriever: Retriever, serve_app: Callable[[Any], ContextManager[str]]) -> Iterator[httpx.Client]:
    with serve_app(create_app(retriever)) as url, httpx.Client(base_url=url, timeout=30) as c:
        yield c


def test_feedback_endpoint(client: httpx.Client) -> None:
    items = client.post("/v1/users/max/retrieve", json={"query": "where do I live?", "k": 2}).json()["items"]
    ids = [it["id"] for it in items]
    r = client.post("/v1/users/max/feedback", json={"query": "where do I live?", "shown_ids": ids,
                                                   "cited_ids": ids[:1]})
    assert r.status_code == 200 and r.json()["user_id"] == "max" and r.json()["cited"] == 1
    bad = client.post("/v1/users/max/feedback", json={"query": "q", "shown_ids": ["eve-m0"], "cited_ids": []})
    assert bad.status_code == 422 and "not retrievable" in bad.json()["detail"]
    assert client.post("/v1/users/max/feedback", json={"query": "q", "shown_ids": ids,
                                                      "cited_ids": ["x"]}).status_code == 422
    assert client.post("/v1/users/bad%20id/feedback", json={"query": "q", "shown_ids": ids}).status_code == 422
    assert client.post("/v1/users/max/feedback", json={"query": "q" * 300, "shown_ids": ids}).status_code == 413
