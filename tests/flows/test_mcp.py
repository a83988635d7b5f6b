"""`mnemo mcp`: the SDK's own client spawns `python -m flows.cli --store DIR mcp` and calls every tool
over stdio on a consolidated store (real results, scoped to the user named); the streamable HTTP
transport answers 401 without the API key and serves the tools with it."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, ContextManager

import anyio
import httpx
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters

from flows.mcp import MCP_PATH, http_app
from memory.embed import Embedder
from memory.settings import RetrievalSettings, Settings
from memory.store import Store
from retrieval import Retriever
from tests.helpers import REPO

KEY = "mcp-key"


def _data(result: Any) -> dict[str, Any]:
    assert not result.is_error, result
    if result.structured_content is not None:
        return dict(result.structured_content)
    return json.loads(result.content[0].text)


async def _session(store_dir: str) -> dict[str, Any]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "flows.cli", "--store", store_dir, "mcp"],
                                   cwd=str(REPO), env={"HF_HUB_OFFLINE": "1"})
    out: dict[str, Any] = {}
    async with Client(params, read_timeout_seconds=120) as client:
        out["tools"] = sorted(t.name for t in (await client.list_tools()).tools)
        out["search"] = _data(await client.call_tool("search_memory", {
            "user_id": "alice", "query": "What guitar did Alice buy?", "k": 5}))
        out["bob_search"] = _data(await client.call_tool("search_memory", {
            "user_id": "bob", "query": "What guitar did Alice buy?", "k": 5}))
        out["context"] = _data(await client.call_tool("get_context", {
            "user_id": "alice", "query": "What guitar did Alice buy?", "max_tokens": 400}))
        out["append"] = _data(await client.call_tool("append_messages", {"user_id": "alice", "messages": [
            {"session_id": "alice-mcp", "message_id": "alice-mcp-1", "speaker": "Alice",
             "text": "I started learning the ukulele too.", "timestamp": "2024-06-01T09:00:00Z"},
            {"session_id": "alice-mcp", "message_id": "alice-mcp-2", "speaker": "Alice", "text": "Bad time.",
             "timestamp": "not a time"}]}))
        shown = [it["id"] for it in out["search"]["items"]]
        out["feedback"] = _data(await client.call_tool("give_feedback", {
            "user_id": "alice", "query": "What guitar did Alice buy?", "shown_ids": shown, "cited_ids": shown[:1]}))
        out["cross_user_feedback"] = await client.call_tool("give_feedback", {
            "user_id": "bob", "query": "guitar?", "shown_ids": shown[:1], "cited_ids": []})
        out["bad_user"] = await client.call_tool("search_memory", {"user_id": "../x", "query": "hi"})
        out["bad_k"] = await client.call_tool("search_memory", {"user_id": "alice", "query": "hi", "k": 0})
        out["tight"] = _data(await client.call_tool("get_context", {
            "user_id": "alice", "query": "What guitar did Alice buy?", "max_tokens": 30}))
    return out


def test_every_tool_over_stdio(sample_store: Store) -> None:
    out = anyio.run(_session, sample_store.uri)
    assert out["tools"] == ["append_messages", "get_context", "give_feedback", "search_memory"]
    items = out["search"]["items"]
    assert items and any("FG800" in it["text"] or "Yamaha" in it["text"] for it in items)
    alice_ids = {it["id"] for it in items}
    assert not alice_ids & {it["id"] for it in out["bob_search"]["items"]}   # scoped to the user named
    assert all(not s.startswith("alice") for it in out["bob_search"]["items"] for s in it["source_ids"])
    assert "guitar" in out["context"]["context"].lower() and out["context"]["item_ids"]
    assert out["append"]["added"] == 1 and out["append"]["quarantined"][0]["index"] == 1
    assert out["feedback"]
    assert out["cross_user_feedback"].is_error and out["bad_user"].is_error
    # the reason comes back, so the model can correct its call
    assert "invalid user id" in out["bad_user"].content[0].text
    assert out["bad_k"].is_error and "k must be between 1 and" in out["bad_k"].content[0].text
    # item_ids are the memories the context shows, not every one retrieved
    assert 1 <= len(out["tight"]["item_ids"]) < len(out["context"]["item_ids"]) <= 10
    msgs = sample_store.read("messages", "alice", columns=["message_id"]).column("message_id").to_pylist()
    assert "alice-mcp-1" in msgs and "alice-mcp-2" not in msgs
    assert sample_store.read("feedback", "alice").num_rows >= 1


def test_http_transport_needs_the_key(sample_store: Store, embedder: Embedder,
                                      serve_app: Callable[..., ContextManager[str]]) -> None:
    r = Retriever(sample_store, Settings(store=sample_store.uri, retrieval=RetrievalSettings(api_key=KEY)),
                  embedder=embedder)
    with serve_app(http_app(r)) as url:
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"}}}
        headers = {"accept": "application/json, text/event-stream"}
        res = httpx.post(f"{url}{MCP_PATH}", json=init, headers=headers)
        assert res.status_code == 401
        res = httpx.post(f"{url}{MCP_PATH}", json=init, headers={**headers, "authorization": "Bearer wrong"})
        assert res.status_code == 401
        res = httpx.post(f"{url}{MCP_PATH}", json=init, headers={**headers, "authorization": f"Bearer {KEY}"})
        assert res.status_code == 200, res.text
        assert "mnemo" in res.text


def test_cli_refuses_an_unknown_transport(tmp_path: Path) -> None:
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "flows.cli", "--store", str(tmp_path / "s"), "mcp",
                           "--transport", "carrier-pigeon"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown transport" in proc.stderr
