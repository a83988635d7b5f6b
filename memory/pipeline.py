"""The consolidation stages for one shard of users, as plain functions over a `ShardState`.

    load_shard -> extract -> embed -> link -> reason -> embed_insights -> commit

Every stage but `load_shard` and `commit` is pure computation over the state (no store I/O
besides the LLM response cache), so Prefect can run each as a task, in threads or on Dask
workers, and `commit` funnels every write of the shard through one writer: tables first, the
users' watermarks last. Row ids are deterministic, so re-running after a crash converges.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any, Callable

import numpy as np
import polars as pl

from memory import prompts
from memory.embed import Embedder, get_embedder
from memory.extract import (OBSERVATION_VERSION, SessionWork, dedupe_items, extraction_requests,
                            fragment_row, observation_items)
from memory.ids import make_id, validate_user_id
from memory.link import Cluster, Link, cluster_session, link_session
from memory.llm.base import LLMBackend, get_backend
from memory.reason import attribute_sources, insight_rows, pair_context
from memory.settings import Settings
from memory.store import Store, users_filter
from memory.summarize import summarize
from memory.topics import topics
from memory.weave import weave

log = logging.getLogger(__name__)

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass
class ShardState:
    """Everything one shard carries from stage to stage; picklable for Dask."""

    run_id: str
    users: list[str]
    sessions: list[SessionWork] = field(default_factory=list)
    message_rows: list[dict[str, Any]] = field(default_factory=list)
    pools: dict[str, list[Cluster]] = field(default_factory=dict)
    watermarks: dict[str, tuple[datetime, int]] = field(default_factory=dict)
    fragments: list[dict[str, Any]] = field(default_factory=list)
    clusters: list[Cluster] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    insights: list[dict[str, Any]] = field(default_factory=list)
    quarantine: list[dict[str, Any]] = field(default_factory=list)
    llm: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    #: rows of later stages' tables (graph, summaries, topics...), written by `commit`
    extra: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: table -> users whose rows `commit` deletes before writing `extra` (a rebuilt graph)
    replace: dict[str, list[str]] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return {
            "users": len({s.user_id for s in self.sessions}), "sessions": len(self.sessions),
            "messages": len(self.message_rows), "fragments": len(self.fragments),
            "clusters": len(self.clusters), "links": len(self.links), "insights": len(self.insights),
            "quarantined": len(self.quarantine),
        }


# -- shared, per-process resources --------------------------------------------------------
@lru_cache(maxsize=4)
def _embedder(name: str, model: str, device: str, batch_size: int) -> Embedder:
    return get_embedder(name, model, device=device, batch_size=batch_size)


def embedder_for(settings: Settings) -> Embedder:
    """The process-wide embedder for these settings (loaded once per worker)."""
    return _embedder(settings.embedder, settings.embed_model, settings.embed_device, settings.embed_batch_size)


_BACKENDS: dict[str, LLMBackend] = {}


def backend_for(settings: Settings) -> LLMBackend:
    """The process-wide LLM backend for these settings (a vLLM model loads once per worker)."""
    kwargs: dict[str, Any] = {"model": settings.llm_model}
    if settings.llm == "openai":
        kwargs.update(base_url=settings.llm_base_url, concurrency=settings.llm_concurrency,
                      timeout_s=settings.llm_timeout_s, max_retries=settings.llm_max_retries,
                      max_tokens=settings.llm_max_tokens, temperature=settings.llm_temperature,
                      api_key=settings.llm_api_key.get_secret_value() if settings.llm_api_key else None)
    elif settings.llm == "vllm":
        kwargs.update(max_tokens=settings.llm_max_tokens, temperature=settings.llm_temperature)
    key = f"{settings.llm}|{sorted((k, str(v)) for k, v in kwargs.items())}"
    if key not in _BACKENDS:
        _BACKENDS[key] = get_backend(settings.llm, **kwargs)
    return _BACKENDS[key]


def _runner(store: Store, settings: Settings) -> Any:
    from memory.llm.cache import ResponseCache
    from memory.llm.runner import LLMRunner

    backend = backend_for(settings)
    return LLMRunner(backend, ResponseCache(store) if backend.reads_cache else None)


def _merge_llm(state: ShardState, stats: Any) -> None:
    for k, v in stats.as_dict().items():
        state.llm[k] = state.llm.get(k, 0) + int(v)


def _timed(state: ShardState, name: str, start: float) -> None:
    state.timings[name] = state.timings.get(name, 0.0) + time.perf_counter() - start


# -- stages -------------------------------------------------------------------------------
def load_shard(store: Store, users: list[str], run_id: str) -> ShardState:
    """Pending sessions (newer than each user's watermark), their messages and the pool as of it."""
    start = time.perf_counter()
    state = ShardState(run_id=run_id, users=[validate_user_id(u) for u in users])
    for user in state.users:
        wm = store.read("watermarks", user)
        last, done = (wm.column("last_session_ts")[0].as_py(), wm.column("sessions_done")[0].as_py()) \
            if wm.num_rows else (EPOCH, 0)
        state.watermarks[user] = (last, done)
        sessions = pl.from_arrow(store.read("sessions", user)).filter(pl.col("ts") > last) \
            .sort(["ts", "session_id"])
        if sessions.height == 0:
            continue
        msgs = pl.from_arrow(store.read("messages", user)).filter(
            pl.col("session_id").is_in(sessions["session_id"].to_list())).sort(["session_id", "seq"])
        obs = pl.from_arrow(store.read("observations", user)) if sessions["observed"].any() else None
        by_session = {k[0]: g for k, g in msgs.group_by(["session_id"], maintain_order=True)}
        for s in sessions.iter_rows(named=True):
            group = by_session.get(s["session_id"])
            rows = group.to_dicts() if group is not None else []
            state.message_rows.extend(rows)
            observations = None
            if s["observed"] and obs is not None:
                observations = obs.filter(pl.col("session_id") == s["session_id"]).to_dicts()
            state.sessions.append(SessionWork(
                user_id=user, session_id=s["session_id"], ts=s["ts"],
                messages=[{"message_id": r["message_id"], "speaker": r["speaker"], "text": r["text"],
                           "ts": r["ts"]} for r in rows],
                observed=bool(s["observed"]), observations=observations))
        clusters = pl.from_arrow(store.read("clusters", user))
        if clusters.height:
            live = clusters.filter((pl.col("session_ts") <= last) &
                                   (pl.col("consumed_ts").is_null() | (pl.col("consumed_ts") > last)))
            state.pools[user] = [Cluster(
                id=r["id"], user_id=user, session_id=r["session_id"], session_ts=r["session_ts"],
                member_ids=list(r["member_ids"]), centroid=np.asarray(r["centroid"], dtype=np.float32),
            ) for r in live.sort(["session_ts", "id"]).iter_rows(named=True)]
    _timed(state, "load", start)
    return state


def extract(state: ShardState, store: Store, settings: Settings) -> ShardState:
    """PREMem step 1 for every pending session of the shard, as one LLM batch."""
    start = time.perf_counter()
    to_llm = [s for s in state.sessions if not s.observed and s.messages]
    if to_llm:
        runner = _runner(store, settings)
        backend = runner.backend
        answers, bad = runner.run(extraction_requests(to_llm))
        _merge_llm(state, runner.stats)
        for session, answer in zip(to_llm, answers):
            if answer is None:
                continue
            ids = {m["message_id"] for m in session.messages}
            for item in dedupe_items(prompts.parse_extraction(answer, ids)):
                state.fragments.append(fragment_row(session, item, run_id=state.run_id, backend=backend.name,
                                                    model=backend.model, prompt_version=prompts.EXTRACT_VERSION))
        for q, session in _quarantined_sessions(bad, to_llm):
            state.quarantine.append(q.row(session.user_id, state.run_id, session.session_id))
    for session in (s for s in state.sessions if s.observed):
        for item in dedupe_items(observation_items(session)):
            state.fragments.append(fragment_row(session, item, run_id=state.run_id, backend="observations",
                                                model="recorded", prompt_version=OBSERVATION_VERSION))
    _timed(state, "extract", start)
    return state


def _quarantined_sessions(bad: list[Any], sessions: list[SessionWork]) -> list[tuple[Any, SessionWork]]:
    by_key = {(s.user_id, s.session_id): s for s in sessions}
    out = []
    for q in bad:
        ctx = q.request.context
        out.append((q, by_key[(ctx["user_id"], ctx["session_id"])]))
    return out


def embed(state: ShardState, store: Store, settings: Settings) -> ShardState:
    """Embed every new message and fragment of the shard in one batch."""
    start = time.perf_counter()
    embedder = embedder_for(settings)
    texts = [f"{m['speaker']}: {m['text']}" for m in state.message_rows] + [f["text"] for f in state.fragments]
    vecs = embedder.embed(texts)
    n = len(state.message_rows)
    for row, vec in zip(state.message_rows, vecs[:n]):
        row["vector"] = vec
        row["embed_model"] = embedder.model_name
    for row, vec in zip(state.fragments, vecs[n:]):
        row["vector"] = vec
    _timed(state, "embed", start)
    return state


def link(state: ShardState, store: Store, settings: Settings) -> ShardState:
    """Cluster each session's fragments and link them to the user's pool, session by session."""
    start = time.perf_counter()
    by_session: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for f in state.fragments:
        by_session.setdefault((f["user_id"], f["session_id"]), []).append(f)
    for session in state.sessions:
        frags = by_session.get((session.user_id, session.session_id), [])
        if not frags:
            continue
        vecs = np.stack([f["vector"] for f in frags])
        clusters = cluster_session(session.user_id, session.session_id, session.ts,
                                   [f["id"] for f in frags], vecs, settings.max_clusters)
        by_id = {f["id"]: f for f in frags}
        for c in clusters:
            for fid in c.member_ids:
                by_id[fid]["cluster_id"] = c.id
        pool = state.pools.get(session.user_id, [])
        links, state.pools[session.user_id] = link_session(pool, clusters, settings.theta)
        state.clusters.extend(clusters)
        state.links.extend(links)
    _timed(state, "link", start)
    return state


def reason(state: ShardState, store: Store, settings: Settings) -> ShardState:
    """PREMem step 2 over every linked pair of the shard, as one LLM batch."""
    start = time.perf_counter()
    if state.links:
        fragments = _all_fragments(state, store)
        runner = _runner(store, settings)
        backend = runner.backend
        requests = [prompts.reason_request(pair_context(lk, fragments)) for lk in state.links]
        answers, bad = runner.run(requests)
        _merge_llm(state, runner.stats)
        for lk, answer in zip(state.links, answers):
            if answer is not None:
                state.insights.extend(insight_rows(lk, prompts.parse_reasoning(answer), run_id=state.run_id,
                                                   backend=backend.name, model=backend.model))
        by_link = {lk.id: lk for lk in state.links}
        for q in bad:
            lk = by_link[q.request.context["link_id"]]
            state.quarantine.append(q.row(lk.new.user_id, state.run_id, lk.id))
        state.insights = list({r["id"]: r for r in state.insights}.values())
    _timed(state, "reason", start)
    return state


def _all_fragments(state: ShardState, store: Store) -> dict[str, dict[str, Any]]:
    """New fragments plus the stored ones that pool clusters of this shard point to."""
    frags = {f["id"]: f for f in state.fragments}
    missing = sorted({fid for lk in state.links for fid in lk.pool.member_ids if fid not in frags})
    if missing:
        for row in store.read_ids("fragments", missing).to_pylist():
            row["vector"] = np.asarray(row["vector"], dtype=np.float32)
            frags[row["id"]] = row
    return frags


def embed_insights(state: ShardState, store: Store, settings: Settings) -> ShardState:
    """Embed the new insights and cite the messages of their closest parent fragments."""
    start = time.perf_counter()
    if state.insights:
        vecs = embedder_for(settings).embed([r["text"] for r in state.insights])
        fragments = _all_fragments(state, store)
        fvecs = {fid: np.asarray(f["vector"], dtype=np.float32) for fid, f in fragments.items()}
        attribute_sources(vecs, state.insights, fvecs, fragments)
        for row, vec in zip(state.insights, vecs):
            row["vector"] = vec
    _timed(state, "embed", start)
    return state


def commit(store: Store, state: ShardState) -> dict[str, int]:
    """Write the shard: every table first, then the watermarks. Safe to repeat."""
    start = time.perf_counter()
    written = {
        "messages": store.upsert("messages", state.message_rows),
        "fragments": store.upsert("fragments", state.fragments),
        "clusters": store.upsert("clusters", [c.row(state.run_id) for c in _touched_clusters(state)]),
        "links": store.upsert("links", [lk.row(state.run_id) for lk in state.links]),
        "insights": store.upsert("insights", state.insights),
        "quarantine": store.upsert("quarantine", state.quarantine),
    }
    for name, users in state.replace.items():
        store.delete(name, users_filter(users))
    for name, rows in state.extra.items():
        written[name] = store.upsert(name, rows)
    now = datetime.now(timezone.utc)
    marks = []
    for user in state.users:
        mine = [s for s in state.sessions if s.user_id == user]
        if not mine:
            continue
        _, done = state.watermarks[user]
        marks.append({"id": make_id("watermark", user), "user_id": user,
                      "last_session_ts": max(s.ts for s in mine), "sessions_done": done + len(mine),
                      "run_id": state.run_id, "updated_at": now})
    written["watermarks"] = store.upsert("watermarks", marks)
    _timed(state, "commit", start)
    return written


def _touched_clusters(state: ShardState) -> list[Cluster]:
    """New clusters plus pool clusters whose consumption this run recorded."""
    out = {c.id: c for c in state.clusters}
    for lk in state.links:
        out[lk.pool.id] = lk.pool
    return list(out.values())


Stage = Callable[[ShardState, Store, Settings], ShardState]


def stages() -> list[tuple[str, Stage, bool]]:
    """The ordered stages between load and commit: (name, function, retry on transient LLM errors).

    Later layers (MemWeaver graph and summaries, RMM topics) add their stage here.
    """
    return [
        ("extract", extract, True),
        ("embed", embed, False),
        ("link", link, False),
        ("reason", reason, True),
        ("embed-insights", embed_insights, False),
        ("weave", weave, False),          # MemWeaver graph: temporal edges + K-means semantic clusters
        ("summarize", summarize, True),   # MemWeaver cognitive memory: phase summaries -> global profile
        ("topics", topics, True),         # RMM prospective reflection: topic memories, Add / Merge
    ]


def has_work(state: ShardState, settings: Settings) -> bool:
    """Whether the shard's stages (and its commit) have anything to do: pending sessions, or a rebuild
    of its users' graphs."""
    return bool(state.sessions) or settings.rebuild_graph


def run_shard(store: Store, users: list[str], settings: Settings, run_id: str) -> ShardState:
    """All stages for one shard, in order, without Prefect."""
    state = load_shard(store, users, run_id)
    if not has_work(state, settings):
        return state
    for _, stage, _ in stages():
        state = stage(state, store, settings)
    commit(store, state)
    return state
