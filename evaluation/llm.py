"""`mnemo bench llm`: how well the pipeline feeds a real LLM server, and what a small model's extraction
is worth for retrieval.

The first LoCoMo conversation, cut to its first `sessions` sessions, is consolidated with the `openai`
backend against a server (by default a llama.cpp server started on loopback with a model from the
`local-llm` extra), every request the pipeline sends being recorded. Then exactly those requests (same
bodies, same structured-output dialect, same token limit) are sent again by a plain concurrent client
at concurrency 1, 2, 4, ... while that raises throughput: (a) the server's best completion tokens/s.
(b) is what the pipeline achieved: its completion tokens over the wall time of the stages that sent
requests. The last line is `llm efficiency (b)/(a)`.
"""
from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ContextManager

import httpx

from evaluation.common import evaluate, load_questions, scratch_store
from memory.errors import ConfigError
from memory.ingest import ingest
from memory.llm.base import LLMBackend, LLMRequest, LLMResponse
from memory.llm.local_server import DEFAULT_MODEL, LocalServer, llama_server
from memory.llm.openai_backend import OpenAIBackend
from memory.llm.structured import DIALECTS, chat_body
from memory.resources import backend_for
from memory.runs import RunReport, consolidate, open_store
from memory.settings import Settings
from memory.store import Store
from memory.text import content_tokens
from retrieval.retriever import Retriever

_DIA = re.compile(r"D\d+:\d+")
#: the stage each request task belongs to
STAGE_OF = {"extract": "extract", "reason": "reason", "summarize": "summarize", "profile": "summarize",
            "topics": "topics", "topic-merge": "topics"}


@dataclass
class Call:
    """One request the pipeline sent and what came back."""

    request: LLMRequest
    response: LLMResponse


@contextmanager
def recording(backend: LLMBackend) -> Iterator[list[Call]]:
    """Every request the process-wide `backend` is sent meanwhile, with its response (the pipeline's
    own backend object, so its calls are seen)."""
    calls: list[Call] = []
    complete = backend.complete

    def recording_complete(requests: list[LLMRequest]) -> list[LLMResponse]:
        responses = complete(requests)
        calls.extend(Call(r, resp) for r, resp in zip(requests, responses))
        return responses

    backend.complete = recording_complete  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        del backend.complete  # back to the class's method


def locomo_slice(path: str, sessions: int, out: Path) -> Path:
    """The first conversation of the LoCoMo file `path` cut to its first `sessions` sessions (with their
    dates and observations), keeping the questions whose evidence lies in them, written to `out`."""
    sample = json.loads(Path(path).read_text())[0]
    conv = sample["conversation"]
    keep = {f"session_{i}" for i in range(1, sessions + 1)}
    if not keep <= set(conv):
        raise ConfigError(f"{path}: the first conversation has fewer than {sessions} sessions", sessions=sessions)
    conv = {k: v for k, v in conv.items() if not k.startswith("session_") or k.rsplit("_date_time", 1)[0] in keep}
    dias = {t["dia_id"] for k in keep for t in sample["conversation"][k]}
    qa = [q for q in sample["qa"] if (cited := set(_DIA.findall(" ".join(map(str, q.get("evidence", []))))))
          and cited <= dias]
    observation = {k: v for k, v in sample.get("observation", {}).items() if k.rsplit("_observation", 1)[0] in keep}
    out.write_text(json.dumps([{**sample, "conversation": conv, "qa": qa, "observation": observation,
                                "session_summary": {}, "event_summary": {}}]))
    return out


def server_throughput(base_url: str, bodies: list[dict[str, Any]], concurrency: int,
                      timeout_s: float = 1800.0) -> tuple[float, int, float]:
    """Send `bodies` to the chat-completions endpoint with at most `concurrency` in flight, nothing else
    in the way: (completion tokens/s, completion tokens, seconds)."""
    async def run() -> tuple[int, float]:
        limit = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s) as client:
            # untimed: replace the prompt the server keeps evaluated (llama.cpp reuses the longest common
            # prefix with the last prompt), so the first request is not served from the previous pass
            flush = {"model": bodies[0]["model"], "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 1}
            (await client.post("/chat/completions", json=flush)).raise_for_status()
            async def one(body: dict[str, Any]) -> int:
                async with limit:
                    resp = await client.post("/chat/completions", json=body)
                    resp.raise_for_status()
                    return int(resp.json()["usage"]["completion_tokens"])
            start = time.perf_counter()
            tokens = await asyncio.gather(*(one(b) for b in bodies))
            return sum(tokens), time.perf_counter() - start
    tokens, seconds = asyncio.run(run())
    return tokens / seconds, tokens, seconds


def junk_share(store: Store) -> tuple[int, int]:
    """(fragments whose content shares no content word with their source messages, fragments)."""
    texts = {r["message_id"]: r["text"] for r in store.read("messages", columns=["message_id", "text"]).to_pylist()}
    junk = total = 0
    for f in store.read("fragments", columns=["text", "source_ids"]).to_pylist():
        total += 1
        source = set(content_tokens(" ".join(texts.get(s, "") for s in f["source_ids"] or []), set()))
        body = f["text"].split(":", 1)[-1]  # the embedded text is "key: subject content"
        junk += not (set(content_tokens(body, set())) & source)
    return junk, total


def recall_at_10(path: Path, store: Store, settings: Settings) -> tuple[float, int]:
    """LoCoMo Recall@10 of the default strategy on `store` for the questions of `path`: (recall, questions)."""
    retriever = Retriever(store, settings)
    questions = load_questions(str(path), store)
    if not questions:
        return float("nan"), 0
    vecs = retriever.embed([q["question"] for q in questions])
    row = evaluate(retriever, questions, vecs, retriever.settings.default_strategy, [10])
    return float(row["R@10"]), len(questions)


def _baseline(path: Path, root: str, extraction: str, settings: Settings) -> Store:
    cfg = settings.with_overrides(store=root, llm="rules")
    store = open_store(cfg)
    ingest(store, str(path), "locomo", observations_as_fragments=extraction == "observations")
    consolidate(store, cfg)
    return store


def bench_llm(path: str, *, sessions: int = 3, model: str = DEFAULT_MODEL, base_url: str | None = None,
              max_tokens: int = 192, concurrencies: list[int] | None = None, store: str | None = None,
              settings: Settings | None = None) -> str:
    """Consolidate a LoCoMo slice through a real server and report feeding efficiency and quality."""
    cfg = settings or Settings()
    server: ContextManager[Any] = nullcontext(None) if base_url else llama_server(model)
    with scratch_store(store, "mnemo-bench-llm-") as root, server as local:
        url, name = (local.base_url, local.model) if isinstance(local, LocalServer) else (base_url, cfg.llm_model)
        if not name:
            raise ConfigError("bench llm --base-url needs the served model's name: --llm-model or MNEMO_LLM_MODEL")
        sliced = locomo_slice(path, sessions, Path(root).parent / f"{Path(root).name}-locomo.json")
        # llama.cpp answers one request at a time: a request's time includes its wait behind the others
        # in flight, so the timeout must cover `llm_concurrency` answers, not one
        run_cfg = cfg.with_overrides(store=root, llm="openai", llm_base_url=url, llm_model=name,
                                     llm_max_tokens=max_tokens, llm_timeout_s=max(cfg.llm_timeout_s, 900.0))
        return _bench(sliced, run_cfg, concurrencies or [1, 2, 4, 8], cfg)


def _bench(sliced: Path, cfg: Settings, concurrencies: list[int], base: Settings) -> str:
    st = open_store(cfg)
    ingest(st, str(sliced), "locomo")
    backend = backend_for(cfg)
    assert isinstance(backend, OpenAIBackend)
    with recording(backend) as calls:
        report = consolidate(st, cfg)
    llm_stages = {STAGE_OF.get(c.request.task, c.request.task) for c in calls}
    stage_s = sum(report.timings.get(s, 0.0) for s in llm_stages)
    sent = [c for c in calls if c.response.error is None]
    tokens_out = sum(c.response.tokens_out for c in sent)
    achieved = tokens_out / stage_s if stage_s else 0.0

    dialect = backend.dialect or DIALECTS[0]
    bodies = [{"model": backend.model, **chat_body(c.request, dialect, max_tokens=backend.max_tokens,
                                                   temperature=backend.temperature)} for c in sent]
    best, sweep = 0.0, []
    for n in sorted(set(concurrencies)):
        rate, tokens, seconds = server_throughput(backend.base_url, bodies, n)
        sweep.append(f"c={n}: {rate:.1f} tok/s ({tokens} tokens in {seconds:.1f}s)")
        if rate <= best * 1.02:  # no longer rising: more in flight only queues
            best = max(best, rate)
            break
        best = rate
    return "\n".join([*_usage(sliced, report, calls, backend, st, llm_stages, stage_s),
                      *_quality(sliced, st, base),
                      f"server alone       {'; '.join(sweep)}",
                      f"(a) server best    {best:.1f} completion tok/s (same {len(bodies)} requests, "
                      f"{dialect.name} dialect, max_tokens {backend.max_tokens})",
                      f"(b) pipeline       {achieved:.1f} completion tok/s ({tokens_out} tokens over "
                      f"{stage_s:.1f}s of {', '.join(sorted(llm_stages))})",
                      f"llm efficiency {achieved / best if best else 0.0:.2f}"])


def _usage(sliced: Path, report: RunReport, calls: list[Call], backend: OpenAIBackend, st: Store,
           llm_stages: set[str], stage_s: float) -> list[str]:
    n = max(1, report.counts.get("sessions", 0))
    per_stage: dict[str, Counter[str]] = defaultdict(Counter)
    for call in calls:
        stage = per_stage[STAGE_OF.get(call.request.task, call.request.task)]
        stage["requests"] += 1
        stage["tokens_in"] += call.response.tokens_in
        stage["tokens_out"] += call.response.tokens_out
    llm = report.llm
    junk, frags = junk_share(st)
    lines = [
        f"archive            {sliced.name}: {report.counts.get('sessions', 0)} sessions, "
        f"{report.counts.get('messages', 0)} messages; model {backend.model} at {backend.base_url}",
        f"run                {report.status} in {report.seconds:.1f}s; LLM stages {stage_s:.1f}s ("
        + ", ".join(f"{k} {report.timings.get(k, 0.0):.1f}s" for k in sorted(llm_stages)) + ")",
        f"requests           {len(calls)} ({len(calls) / n:.2f}/session), tokens in {llm.get('tokens_in', 0)} "
        f"({llm.get('tokens_in', 0) / n:.0f}/session), out {llm.get('tokens_out', 0)} "
        f"({llm.get('tokens_out', 0) / n:.0f}/session)",
    ]
    for name, counts in sorted(per_stage.items()):
        lines.append(f"  {name:<16} {counts['requests']} requests ({counts['requests'] / n:.2f}/session), "
                     f"{counts['tokens_in']} in, {counts['tokens_out']} out")
    lines += [
        f"parse failures     {llm.get('retries', 0)} answers re-asked; quarantined {llm.get('quarantined', 0)} "
        f"of {len(calls) - llm.get('retries', 0)} requests ({llm.get('quarantined', 0) / max(1, len(calls) - llm.get('retries', 0)):.0%})",
        f"retries            {backend.http_retries} HTTP retries after transient failures",
        f"junk fragments     {junk} of {frags} ({junk / max(1, frags):.0%}) share no content word with their sources",
    ]
    return lines


def _quality(sliced: Path, st: Store, base: Settings) -> list[str]:
    model_r, n = recall_at_10(sliced, st, base.with_overrides(store=st.uri))
    parts = [f"model {model_r:.3f}"]
    for extraction in ("rules", "observations"):
        with scratch_store(None, f"mnemo-bench-llm-{extraction}-") as root:
            other = _baseline(sliced, root, extraction, base)
            parts.append(f"{extraction} {recall_at_10(sliced, other, base.with_overrides(store=root))[0]:.3f}")
    return [f"Recall@10          default strategy, {n} questions: " + ", ".join(parts)]
