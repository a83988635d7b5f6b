"""A real LLM through the whole pipeline: llama-cpp-python's OpenAI-compatible server on loopback with
SmolLM2-135M-Instruct (the `local-llm` extra), the example archive (`examples/sample.jsonl`, whole)
consolidated with `--llm openai`.

The tiny model answers badly; what is checked is the path: real requests from every LLM stage, real
answers parsed or quarantined with their raw text, a completed run, a moved watermark, a re-run and a
rebuild answered entirely from the response cache, and `replay` reproducing the store.
"""
from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flows.cli import app
from memory.llm.local_server import LocalServer, llama_server, missing
from memory.runs import open_store
from memory.settings import Settings
from memory.store import Store
from tests.helpers import SAMPLE, memory_snapshot

WHY = missing()
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800),
              pytest.mark.skipif(WHY is not None, reason=f"the local-llm extra is not installed: {WHY}")]

#: answers cut short on purpose: the run must take minutes, not hours, on 2 CPU cores
MAX_TOKENS = "192"
LLM_STAGES = {"extract", "reason", "summarize", "topics"}


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    """The llama.cpp server with SmolLM2 for this module, stopped after its tests."""
    with llama_server(n_ctx=4096, log_dir=str(tmp_path_factory.mktemp("llama"))) as server:
        yield server


def served(server: LocalServer) -> int:
    """Chat completions the server has answered so far (its own access log, not our counters; the one
    request per backend that tried the `json_schema` dialect got a 500 and is not counted)."""
    return sum("/v1/chat/completions" in line and '" 200' in line
               for line in server.log_path.read_text(errors="replace").splitlines())


def consolidate(store: Path, llm: str, server: LocalServer, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`mnemo consolidate --llm LLM --engine local` on `store`, pointed at the server."""
    monkeypatch.setenv("MNEMO_LLM_BASE_URL", server.base_url)
    monkeypatch.setenv("MNEMO_LLM_MODEL", server.model)
    monkeypatch.setenv("MNEMO_LLM_MAX_TOKENS", MAX_TOKENS)
    monkeypatch.setenv("MNEMO_LLM_CONCURRENCY", "2")
    # llama.cpp answers one request at a time: a request's time includes the wait behind the one before it
    monkeypatch.setenv("MNEMO_LLM_TIMEOUT_S", "900")
    return CliRunner().invoke(app, ["--store", str(store), "consolidate", "--llm", llm, "--engine", "local"])


def last_run(store: Store) -> dict[str, Any]:
    return max(store.read("runs").to_pylist(), key=lambda r: r["started_at"])


def run_count(store: Store) -> int:
    return store.read("runs").num_rows


def with_cache_of(src: Store, pristine: Path, dst: Path) -> Store:
    """A copy of the ingested-only store `pristine` holding `src`'s recorded LLM answers."""
    shutil.copytree(pristine, dst)
    store = open_store(Settings(store=str(dst)))
    store.upsert("llm_cache", src.read("llm_cache").to_pylist())
    return store


def stage_of(task: str) -> str:
    """The stage a request task belongs to (topics sends `topic-*`, summarize sends `profile` too)."""
    return {"profile": "summarize"}.get(task, "topics" if task.startswith("topic") else task)


def test_a_real_model_through_every_llm_stage(llama: LocalServer, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    root, pristine = tmp_path / "store", tmp_path / "ingested"
    ingested = CliRunner().invoke(app, ["--store", str(root), "ingest", str(SAMPLE), "--format", "jsonl"])
    assert ingested.exit_code == 0, ingested.output
    shutil.copytree(root, pristine)

    before = served(llama)
    out = consolidate(root, "openai", llama, monkeypatch)
    assert out.exit_code in (0, 3), out.output  # 3: the run completed and set bad answers aside
    store = open_store(Settings(store=str(root)))
    run = last_run(store)
    sent = served(llama) - before
    assert run["status"] in ("completed", "quarantined") and run["llm_calls"] == sent > 0
    assert run["tokens_out"] > 0 and run["tokens_in"] > run["tokens_out"]
    log = llama.log_path.read_text(errors="replace")
    assert "failed to parse grammar" not in log, "a schema reached the server in a form its grammar converter breaks"

    # every LLM stage asked the real model, and each answer was parsed or quarantined with its text
    recorded = store.read("llm_cache").to_pylist()
    assert {stage_of(r["task"]) for r in recorded} >= LLM_STAGES, Counter(r["task"] for r in recorded)
    assert all(r["model"] == llama.model and r["response"] for r in recorded)
    bad = [q for q in store.read("quarantine").to_pylist() if q["stage"] in {r["task"] for r in recorded}]
    assert all(q["raw"] and q["reason"] for q in bad), bad
    counts = memory_snapshot(store)["stats"]
    assert counts, "nothing was consolidated"
    watermarks = store.read("watermarks").to_pylist()
    assert {w["user_id"] for w in watermarks} == {"alice", "bob"}

    # a re-run pays nothing: pending (quarantined) work is answered from the record
    runs = run_count(store)
    again = consolidate(root, "openai", llama, monkeypatch)
    assert again.exit_code in (0, 3), again.output
    assert served(llama) - before == sent
    assert run_count(store) == runs or last_run(store)["llm_calls"] == 0

    # a rebuild of the same archive with the recorded answers sends 0 requests and builds the same memory
    rebuilt_root = tmp_path / "rebuilt"
    rebuilt = with_cache_of(store, pristine, rebuilt_root)
    out = consolidate(rebuilt_root, "openai", llama, monkeypatch)
    assert out.exit_code in (0, 3), out.output
    assert served(llama) - before == sent
    run2 = last_run(rebuilt)
    assert run2["llm_calls"] == 0 and run2["cache_hits"] >= len(recorded) > 0
    want = memory_snapshot(store)
    assert memory_snapshot(rebuilt) == want

    # replay reproduces it without a model
    replayed_root = tmp_path / "replayed"
    replayed = with_cache_of(store, pristine, replayed_root)
    out = consolidate(replayed_root, "replay", llama, monkeypatch)
    assert out.exit_code in (0, 3), out.output
    assert memory_snapshot(replayed) == want and served(llama) - before == sent


def test_every_prompt_schema_becomes_a_grammar_llama_cpp_parses() -> None:
    """llama.cpp breaks on `\\d`, `\\s`, `(?:` in patterns (a grammar that fails to parse, or HTTP 500): the
    schema the backends decode with is spelled so that its converter and parser take every prompt's."""

    import llama_cpp
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    from memory import prompts
    from memory.llm.local_server import model_path
    from memory.llm.structured import decoding_schema

    vocab_only = llama_cpp.Llama(model_path=str(model_path()), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(vocab_only.model)
    schemas = [prompts.EXTRACT_SCHEMA, prompts.REASON_SCHEMA, prompts.SUMMARIZE_SCHEMA, prompts.PROFILE_SCHEMA,
               prompts.topic_extract_schema(12), prompts.topic_merge_schema(3)]
    for schema in schemas:
        request = prompts.LLMRequest(task="t", prompt_version="v", messages=[], schema=schema)
        for max_tokens in (None, 128, 2048):
            grammar = json_schema_to_gbnf(json.dumps(decoding_schema(request, max_tokens)))
            sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
            assert sampler, (schema, max_tokens)
            llama_cpp.llama_sampler_free(sampler)
