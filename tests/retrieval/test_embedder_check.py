"""A retriever opened before any vector was written (a service started on a new store) checks the
store's embedder again once a consolidation records one: queries embedded by another embedder are
refused then (HTTP 500: the service's configuration, not the request), not answered silently."""
from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from memory.errors import EmbedderMismatchError
from memory.ingest import ingest
from memory.settings import Settings
from memory.store import Store
from retrieval.retriever import Retriever
from retrieval.service import create_app
from tests.helpers import SAMPLE


def test_a_service_started_on_a_new_store_checks_the_embedder_once_one_is_recorded(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    ingest(Store(store), SAMPLE, "jsonl")                    # messages, no vectors: nothing recorded
    r = Retriever.open(store, Settings(store=store).with_overrides(retrieval={"refresh_ms": 0}))
    assert r.retrieve("alice", "guitar").items == []         # unconsolidated: nothing to search yet
    Store(store).table("messages").update(values={"embed_model": "all-MiniLM-L6-v2+onnx"})   # another wrote
    with pytest.raises(EmbedderMismatchError, match="all-MiniLM-L6-v2\\+onnx"):
        r.retrieve("alice", "guitar")
    res = TestClient(create_app(r)).post("/v1/users/alice/retrieve", json={"query": "guitar"})
    assert res.status_code == 500 and "all-MiniLM-L6-v2+onnx" in res.json()["detail"]
    Store(store).table("messages").update(values={"embed_model": "all-MiniLM-L6-v2"})
    assert r.retrieve("alice", "guitar").items == []         # the same embedder again: answered
