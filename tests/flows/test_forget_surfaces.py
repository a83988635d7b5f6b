"""`mnemo forget` and the service's forget routes on a consolidated sample store: the summary, the
JSON report, exit 75 during a run, and a real HTTP server whose retriever stops returning forgotten
memories."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, ContextManager

import httpx
from typer.testing import CliRunner

from flows.cli import app
from flows.service import create_app
from memory.embed import Embedder
from memory.settings import RetrievalSettings, Settings
from memory.store import Store
from retrieval import Retriever
from tests.helpers import run_lease_held

KEY = "forget-secret"


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def test_cli_forgets_a_session_and_reports(sample_store: Store) -> None:
    out = invoke("--store", sample_store.uri, "forget", "alice", "--session", "alice-s2")
    assert out.exit_code == 0, out.output
    assert "forget forget-" in out.output and "messages forgotten" in out.output and "purged" in out.output
    assert sample_store.read("messages", "alice").num_rows > 0
    assert "alice-s2" not in sample_store.read("sessions", columns=["session_id"]).column("session_id").to_pylist()
    again = invoke("--store", sample_store.uri, "forget", "alice", "--session", "alice-s2", "--json")
    assert again.exit_code == 0, again.output
    report = json.loads(again.output)
    assert report["messages"] == 0 and report["rederived"] == {}
    kept = invoke("--store", sample_store.uri, "forget", "alice", "--before", "2024-03-03", "--keep-versions")
    assert kept.exit_code == 0 and "old versions kept" in kept.output, kept.output
    bad = invoke("--store", sample_store.uri, "forget", "alice", "--before", "yesterday")
    assert bad.exit_code == 2 and "ISO 8601" in bad.output
    bad = invoke("--store", sample_store.uri, "forget", "alice", "--session", "s\udcff")
    assert bad.exit_code == 2 and "surrogate" in bad.output, bad.output


def test_cli_exits_75_while_a_consolidation_runs(sample_store: Store) -> None:
    with run_lease_held(sample_store.uri):
        out = invoke("--store", sample_store.uri, "forget", "alice")
    assert out.exit_code == 75, out.output
    assert sample_store.read("messages", "alice").num_rows > 0
    with run_lease_held(sample_store.uri):   # training waits too: a forget may be deleting its feedback
        out = invoke("--store", sample_store.uri, "train-reranker")
    assert out.exit_code == 75, out.output


def test_http_forget_routes(sample_store: Store, embedder: Embedder,
                            serve_app: Callable[..., ContextManager[str]]) -> None:
    settings = Settings(store=sample_store.uri, retrieval=RetrievalSettings(api_key=KEY, refresh_ms=0))
    r = Retriever(sample_store, settings, embedder=embedder)
    query = {"query": "What guitar did Alice buy?", "k": 20}
    with serve_app(create_app(r, settings)) as url, \
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
        assert httpx.post(f"{url}/v1/users/alice/forget", json={}).status_code == 401
        before = c.post("/v1/users/alice/retrieve", json=query).json()["items"]
        assert any("alice-s1-m01" in (it["source_ids"] or []) for it in before)
        res = c.post("/v1/users/alice/forget", json={"sessions": ["alice-s1"]})
        assert res.status_code == 200, res.text
        assert res.json()["messages"] > 0
        assert "alice" not in r.cache.cached()          # the forgotten texts left the service's memory
        after = c.post("/v1/users/alice/retrieve", json=query).json()["items"]
        assert after and not any(s.startswith("alice-s1-") for it in after for s in it["source_ids"] or [])
        assert c.post("/v1/users/alice/forget", json={"before": "not a date"}).status_code == 422
        kept = sample_store.read("messages", "alice").num_rows
        for body in ({"session": ["alice-s2"]}, {}, {"sessions": ["s\udcff"]}):   # a typo, nothing, no id
            refused = c.post("/v1/users/alice/forget", content=json.dumps(body), headers={"Content-Type": "application/json"})
            assert refused.status_code == 422, (body, refused.text)
        assert sample_store.read("messages", "alice").num_rows == kept   # never read as "the whole user"
        gone = c.delete("/v1/users/bob")
        assert gone.status_code == 200 and gone.json()["deleted"]["messages"] > 0
        assert c.post("/v1/users/bob/retrieve", json=query).json()["items"] == []
        assert c.delete("/v1/users/bob").json()["messages"] == 0
        with run_lease_held(sample_store.uri):
            busy = c.delete("/v1/users/alice")
        assert busy.status_code == 409 and "in progress" in busy.json()["detail"]


def test_a_forget_elsewhere_drops_the_users_from_a_running_cache(sample_store: Store, embedder: Embedder) -> None:
    settings = Settings(store=sample_store.uri, retrieval=RetrievalSettings(refresh_ms=0))
    r = Retriever(sample_store, settings, embedder=embedder)
    for user in ("alice", "bob"):
        assert r.retrieve(user, "What guitar did Alice buy?", k=5).items
    assert set(r.cache.cached()) == {"alice", "bob"}
    out = invoke("--store", sample_store.uri, "forget", "bob")     # its own store handle, as another process
    assert out.exit_code == 0, out.output
    assert r.retrieve("alice", "What guitar did Alice buy?", k=5).items   # any request checks the store
    assert r.cache.cached() == ["alice"]     # bob's texts left this cache without a request of bob's
