"""What every consolidation stage shares: the shard's state, the stage context and small helpers.

A shard is a few users consolidated together. `ShardState` carries everything from `load_shard`
through the stages to `commit` (picklable, so Prefect can move it between Dask workers);
`StageContext` is what a stage may use besides it: the store (read-only to stages, plus the LLM
response cache), the settings, the run id, the embedder and LLM runners. Stages only read the store;
the rows they produce wait in the state (`add_rows`, `replace_user`) until `commit` writes them.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterator

import numpy as np
import polars as pl

from memory.dates import local_time
from memory.embed import Embedder, embedder_for
from memory.graph import Node, node_of
from memory.ids import make_id
from memory.llm.runner import LLMRunner, LLMStats
from memory.resources import runner_for
from memory.settings import Settings
from memory.store import Store


# -- what a shard carries -----------------------------------------------------------------------
@dataclass
class SessionWork:
    """One pending session of one user, with its messages in order."""

    user_id: str
    session_id: str
    ts: datetime
    messages: list[dict[str, Any]]        # message_id, speaker, text, ts
    observed: bool = False
    observations: list[dict[str, Any]] | None = None
    #: "new" (first consolidation), "full" (reopened: appended messages or a pending extraction; every
    #: stage over `messages` only), "topics" (only the topic requests of the retried subjects) or
    #: "reason" (only the reason requests of the retried links; no messages)
    mode: str = "new"
    #: the session's message count when loaded
    n_messages: int = 0
    #: pending items (see `memory.stages.load`) this run retries
    retrying: list[dict[str, Any]] = field(default_factory=list)

    @property
    def first(self) -> bool:
        """Whether this is the session's first consolidation."""
        return self.mode == "new"

    @property
    def extracts(self) -> bool:
        """Whether extract and the stages after it take this session (not a topics or reason retry)."""
        return self.mode not in ("topics", "reason")

    @property
    def topic_subjects(self) -> list[str]:
        """The subjects a topics-only retry asks about."""
        return [i["subject"] for i in self.retrying if i["work"] == "topics"]

    @property
    def reason_links(self) -> list[str]:
        """The ids of the links whose quarantined reason request this run asks again."""
        return [i["subject"] for i in self.retrying if i["work"] == "reason"]

    @property
    def participants(self) -> list[str]:
        return list(dict.fromkeys(m["speaker"] for m in self.messages))

    def context(self) -> dict[str, Any]:
        return {
            "user_id": self.user_id, "session_id": self.session_id, "participants": self.participants,
            "messages": [{"message_id": m["message_id"], "speaker": m["speaker"], "text": m["text"],
                          "ts": local_time(m).isoformat()} for m in self.messages],   # the speaker's time
        }


@dataclass
class Cluster:
    """A group of fragments of one session, with its (unnormalized) centroid."""

    id: str
    user_id: str
    session_id: str
    session_ts: datetime
    member_ids: list[str]
    centroid: np.ndarray
    consumed_ts: datetime | None = None
    consumed_by: str | None = None

    @classmethod
    def from_row(cls, r: dict[str, Any], *, consumption: bool = False) -> "Cluster":
        """A cluster from its `clusters` row (with its consumption only when asked: the pool is loaded
        as of the watermark, where it was not yet consumed)."""
        return cls(id=r["id"], user_id=r["user_id"], session_id=r["session_id"], session_ts=r["session_ts"],
                   member_ids=list(r["member_ids"]), centroid=np.asarray(r["centroid"], dtype=np.float32),
                   consumed_ts=r["consumed_ts"] if consumption else None,
                   consumed_by=r["consumed_by"] if consumption else None)

    def row(self, run_id: str) -> dict[str, Any]:
        return {
            "id": self.id, "user_id": self.user_id, "session_id": self.session_id,
            "session_ts": self.session_ts, "member_ids": self.member_ids, "size": len(self.member_ids),
            "centroid": self.centroid.astype(np.float32), "consumed_ts": self.consumed_ts,
            "consumed_by": self.consumed_by, "run_id": run_id,
        }


@dataclass
class Link:
    """A connected pair (p from the pool, c from the new session) with sim(p, c) > θ."""

    pool: Cluster
    new: Cluster
    similarity: float
    id: str = field(init=False)

    def __post_init__(self) -> None:
        self.id = make_id(self.new.user_id, self.pool.id, self.new.id)

    def row(self, run_id: str) -> dict[str, Any]:
        return {
            "id": self.id, "user_id": self.new.user_id, "pool_cluster_id": self.pool.id,
            "new_cluster_id": self.new.id, "session_id": self.new.session_id,
            "similarity": self.similarity, "run_id": run_id,
        }


@dataclass
class ShardState:
    """Everything one shard carries from stage to stage; picklable for Dask."""

    run_id: str
    users: list[str]
    sessions: list[SessionWork] = field(default_factory=list)
    message_rows: list[dict[str, Any]] = field(default_factory=list)
    pools: dict[str, list[Cluster]] = field(default_factory=dict)
    #: per user with a session dated before its watermark (late or reopened): the clusters that were
    #: in the pool at that session's time but that sessions up to the watermark consumed since, with
    #: their consumption (`link` links them, as it would have on time, and leaves them consumed)
    consumed: dict[str, list[Cluster]] = field(default_factory=dict)
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
    #: stored `progress` rows of the sessions (and users, key session "") this shard works on
    progress: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    #: progress rows `load` made for users consolidated before progress was tracked
    migrate: list[dict[str, Any]] = field(default_factory=list)
    #: users whose quarantined summaries this run retries
    summary_retry: list[str] = field(default_factory=list)
    #: work this run quarantined: (user, session id or "") -> {work key: quarantine row ids}
    quarantined_work: dict[tuple[str, str], dict[str, list[str]]] = field(default_factory=dict)
    #: runs a quarantined piece of work may take before it is given up
    max_attempts: int = 3
    #: what `commit` left of quarantined work: sessions (and users) pending, given up, retried, recovered
    outcome: dict[str, int] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return {
            "users": len({s.user_id for s in self.sessions}), "sessions": len(self.sessions),
            "messages": len(self.message_rows), "fragments": len(self.fragments),
            "clusters": len(self.clusters), "links": len(self.links), "insights": len(self.insights),
            "quarantined": len(self.quarantine),
        }


# -- what a stage may use besides the state ------------------------------------------------------
@dataclass(frozen=True)
class StageContext:
    """The store, settings, run id and embedder of a stage run, and its LLM runners.

    Built where the stage runs (in the process or Dask worker), never pickled with the state. The
    embedder is the process-wide one and loads its model on first use; `runner()` builds a runner
    only when a stage asks, so stages without LLM requests never load an LLM backend.
    """

    store: Store
    settings: Settings
    run_id: str
    embedder: Embedder

    @classmethod
    def create(cls, store: Store, settings: Settings, run_id: str) -> StageContext:
        return cls(store=store, settings=settings, run_id=run_id, embedder=embedder_for(settings))

    @contextmanager
    def llm(self, state: ShardState) -> Iterator[LLMRunner]:
        """A new LLM runner for a stage's block (process-wide backend, the store's response cache); its
        counts join the shard's when the block ends, raised or not: a stage retried after a transient
        error keeps in the run's summary the requests its failed attempt paid for."""
        runner = runner_for(self.store, self.settings)
        try:
            yield runner
        finally:
            merge_llm(state, runner.stats)


# -- helpers every stage shares ---------------------------------------------------------------------
def frame(table: Any) -> pl.DataFrame:
    """An Arrow table read from the store as a Polars DataFrame."""
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    return df


@contextmanager
def timed(state: ShardState, name: str) -> Iterator[None]:
    """Add the block's wall time to `state.timings[name]` (not when the block raises)."""
    start = time.perf_counter()
    yield
    state.timings[name] = state.timings.get(name, 0.0) + time.perf_counter() - start


def merge_llm(state: ShardState, stats: LLMStats) -> None:
    """Add a stage runner's counts to the shard's."""
    for k, v in stats.as_dict().items():
        state.llm[k] = state.llm.get(k, 0) + int(v)


def quarantine_work(state: ShardState, row: dict[str, Any], user: str, session_id: str, work: str) -> None:
    """A quarantine row for `commit`, leaving `work` of that session ("" for the user's own work:
    summaries) pending for the next run: `extract`, `topics:<subject>`, `reason:<link id>` or
    `summarize`."""
    state.quarantine.append(row)
    ids = state.quarantined_work.setdefault((user, session_id), {}).setdefault(work, [])
    if row["id"] not in ids:
        ids.append(row["id"])


def active(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pending items of a `progress` row still to retry (not given up)."""
    return [i for i in items if not i.get("given_up")]


def fragment_text(key: str, subject: str, content: str) -> str:
    """What gets embedded: key phrase plus content, naming the subject (PREMem §3.2.1)."""
    body = content if content.lower().startswith(subject.lower()) else f"{subject} {content}"
    return f"{key}: {body}"


def fragment_row(session: SessionWork, item: dict[str, Any], *, run_id: str, backend: str, model: str,
                 prompt_version: str) -> dict[str, Any]:
    """A fragments-table row (without vector) for one parsed extraction item."""
    fid = make_id(session.user_id, session.session_id, item["category"], item["subject"], item["key"],
                  item["content"], item["date"], *item["source_ids"], prompt_version)
    return {
        "id": fid, "user_id": session.user_id, "session_id": session.session_id,
        "session_ts": session.ts, "subject": item["subject"], "category": item["category"],
        "key": item["key"], "content": item["content"], "date": item["date"],
        "text": fragment_text(item["key"], item["subject"], item["content"]),
        "source_ids": list(item["source_ids"]), "run_id": run_id, "backend": backend, "model": model,
        "prompt_version": prompt_version,
    }


def add_rows(state: ShardState, table: str, rows: list[dict[str, Any]]) -> None:
    """Rows of `table` for `commit` to write."""
    state.extra.setdefault(table, []).extend(rows)


def replace_user(state: ShardState, table: str, user: str) -> None:
    """Ask `commit` to delete the user's rows of `table` before writing the new ones."""
    users = state.replace.setdefault(table, [])
    if user not in users:
        users.append(user)


def has_stored(state: ShardState, user: str) -> bool:
    """Whether the user may have stored memories up to its watermark. False for a user never
    consolidated (watermark `(EPOCH, 0)` from `load_shard`: every user of a backfill): consolidation
    only takes sessions after the watermark, so nothing stored is that old and the stages skip the
    reads of stored memories (they would all be filtered out)."""
    return state.watermarks[user][1] > 0


def all_fragments(state: ShardState, store: Store) -> dict[str, dict[str, Any]]:
    """New fragments plus the stored ones the shard's links point to (pool clusters; both sides of a
    link whose reason request is retried)."""
    frags = {f["id"]: f for f in state.fragments}
    missing = sorted({fid for lk in state.links for fid in (*lk.pool.member_ids, *lk.new.member_ids)
                      if fid not in frags})
    if missing:
        for row in store.read_ids("fragments", missing).to_pylist():
            row["vector"] = np.asarray(row["vector"], dtype=np.float32)
            frags[row["id"]] = row
    return frags


def new_nodes(state: ShardState, user: str, kinds: tuple[str, ...] = ("fragment", "insight")) -> list[Node]:
    """The shard's new memories of one user as nodes (unordered)."""
    seqs = {m["message_id"]: int(m.get("seq") or 0) for m in state.message_rows if m["user_id"] == user}
    for s in state.sessions:  # a reopened session's messages embedded earlier are not rewritten
        if s.user_id == user:
            for m in s.messages:
                seqs.setdefault(m["message_id"], int(m.get("seq") or 0))
    out = []
    if "fragment" in kinds:
        out += [node_of(f, "fragment", seqs) for f in state.fragments
                if f["user_id"] == user and f.get("vector") is not None]
    if "insight" in kinds:
        out += [node_of(r, "insight", seqs) for r in state.insights
                if r["user_id"] == user and r.get("vector") is not None]
    return out


def users_to_update(state: ShardState, settings: Settings, kinds: tuple[str, ...]) -> list[str]:
    """Users with new memories of these kinds, or every user of the shard on a rebuild."""
    if settings.rebuild_graph:
        return list(state.users)
    have = {f["user_id"] for f in state.fragments} if "fragment" in kinds else set()
    if "insight" in kinds:
        have |= {r["user_id"] for r in state.insights}
    return [u for u in state.users if u in have]
