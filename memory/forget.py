"""Forget: delete a user's messages (some, a session's, those before a date, or all of them) and
everything derived from them, re-derive what survives, and purge the bytes (GDPR art. 17).

    report = forget(store, settings, "alice", sessions=["alice-s2"])

How (exact, and linear in what it redoes, never quadratic):

1. Plan (`memory.forget_plan`, read-only): the forgotten messages; every derived row whose provenance
   reaches them (tainted); the rollback point W, the newest session before the earliest session a
   tainted row or forgotten message belongs to. Consolidation is defined session by session in time
   order, and the stages already read "the user's memory as of a watermark" (the pool by
   `consumed_ts`, the topic bank by `history_json`, graph nodes and phases by `session_ts`: that is
   how a crashed run re-runs), so rolling the user back to W and consolidating the surviving sessions
   after W again gives exactly what a consolidation without the forgotten messages gives: the same
   fragments (ids and text) as a fresh consolidation of the remaining messages, no surviving row
   citing a forgotten id. Unchanged prompts are answered by the LLM response cache and unchanged texts
   keep their stored vectors (`ReuseEmbedder`), so the redo pays only for what changed.
2. Compute everything in memory: the re-run's rows (the consolidation stages, run on a shard state
   built as of W), the rows to delete (the forgotten messages, sessions left empty, observations,
   the user's derived rows after W, feedback that showed or cited a deleted memory, reranker versions
   trained on that feedback, quarantine rows of the forgotten messages and of redone LLM work, cached
   LLM answers whose prompt quoted a forgotten message or a tainted memory: `ResponseCache.forget_rows`).
3. Write it all as one unit (`Store.unit`: one hold of the write lease and a commit marker, so
   readers see the store before or after, never half), watermark
   last, with an intent recorded first in `runs` (kind `forget`, status `started`, the scope and the
   message ids, never text): a forget that dies midway is completed by the next forget of that user,
   or first thing by the next consolidation of that user (`finish_forgets`).
4. Purge (`memory.forget_purge`): compact the touched tables and remove every old version, unless
   `keep_versions` (time travel kept; the forgotten text then stays in old versions). The run is
   recorded `purging` (with its tables, the ids dropped) before the purge and `completed` after it, so
   a purge that fails (the write lease busy) or dies is finished by the next forget of any user,
   even one that forgets nothing.

The whole forget holds the store's run lease: during a consolidation it waits `run_lease_wait_s`,
then raises `RunInProgressError`. Forgetting twice, or what does not exist, reports zero.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
from lancedb.expr import col

from memory.embed import check_embedder, embedder_for
from memory.forget_plan import (Plan, ReuseEmbedder, RollbackView, Scope, feedback_ids, plan, reranker_ids,
                                 rerun_state, settle_appends)
from memory.forget_quarantine import quarantine_ids
from memory.forget_purge import dir_bytes, purge, unpurged
from memory.pointers import POINTERS, clear_pointers, unstored
from memory.ids import make_id, new_run_id, progress_id
from memory.lease import run_lease
from memory.nightly import forgets_started
from memory.llm.cache import ResponseCache, text_key
from memory.resources import backend_for
from memory.schemas import MEMORY_TABLES, USER_TABLES
from memory.settings import Settings
from memory.stages import STAGES
from memory.stages.commit import commit
from memory.stages.shard import ShardState, StageContext
from memory.stages.topics import load_bank
from memory.store import Store, user_filter
from memory.text import turn_text

#: the tables a live append writes (under the write lease; its quarantine rows `quarantine_ids` reads there)
APPENDED_TABLES = ("messages", "sessions")

@dataclass
class ForgetReport:
    """What one forget did: rows deleted and re-derived per table, LLM use, bytes, time."""

    run_id: str
    user_id: str
    scope: dict[str, Any]
    messages: int = 0
    deleted: dict[str, int] = field(default_factory=dict)
    rederived: dict[str, int] = field(default_factory=dict)
    sessions_rerun: int = 0
    rollback_to: str | None = None
    llm_calls: int = 0
    cache_hits: int = 0
    vectors_reused: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    purged: bool = False
    keep_versions: bool = False
    seconds: float = 0.0

    @property
    def bytes_reclaimed(self) -> int:
        """Store bytes before minus after: negative on a small store, where the re-derived memories
        and rebuilt indices outweigh what was deleted (the forgotten text is gone all the same)."""
        return self.bytes_before - self.bytes_after

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "bytes_reclaimed": self.bytes_reclaimed}

    def summary(self) -> str:
        dels = ", ".join(f"{k} {v}" for k, v in sorted(self.deleted.items()) if v) or "nothing"
        redo = ", ".join(f"{k} {v}" for k, v in sorted(self.rederived.items()) if v) or "nothing"
        purge_note = ("old versions kept (--keep-versions): the forgotten text stays in older table versions "
                      "until they are cleaned up" if self.keep_versions else
                      f"purged: store {self.bytes_before:,} -> {self.bytes_after:,} bytes ("
                      + (f"{self.bytes_reclaimed:,} reclaimed)" if self.bytes_reclaimed >= 0 else
                         f"{-self.bytes_reclaimed:,} more: re-derived rows and rebuilt indices outweigh what "
                         "was deleted)") if self.purged else "nothing to purge")
        return (f"forget {self.run_id}: user {self.user_id}, {self.messages} messages forgotten; deleted: {dels}; "
                f"re-derived ({self.sessions_rerun} sessions after {self.rollback_to or '-'}): {redo}; "
                f"LLM {self.llm_calls} calls, {self.cache_hits} cache hits; {purge_note}; {self.seconds:.1f}s")


def forget(store: Store, settings: Settings, user_id: str, *, sessions: Iterable[str] = (),
           messages: Iterable[str] = (), before: datetime | None = None, keep_versions: bool = False) -> ForgetReport:
    """Forget the user's named sessions / messages / messages before `before` (all of the user when
    nothing is named) and everything derived from them; see the module docstring."""
    scope = Scope(user_id, tuple(sessions), tuple(messages), before)
    start = time.perf_counter()
    started_at = datetime.now(timezone.utc)
    bytes_before = dir_bytes(store.uri)
    with run_lease(store.uri, settings.run_lease_wait_s, settings.lease_backend, settings.lease_ttl_s):
        check_embedder(store, embedder_for(settings))   # its re-derivation writes vectors
        unfinished = unfinished_intents(store, scope.user_id)
        run_id = unfinished[0]["id"] if unfinished else new_run_id("forget")
        recorded = merge_intents(unfinished)
        p = plan(store, scope, recorded=recorded)
        report = ForgetReport(run_id=run_id, user_id=scope.user_id, scope=scope.describe(),
                              messages=len(p.row_ids), keep_versions=keep_versions, bytes_before=bytes_before)
        touched: set[str] = set()
        if not p.empty or unfinished or quarantine_ids(store, p, {}):   # (a named row only quarantined)
            store.upsert("runs", [runs_row(report, "started", started_at, intent(p, recorded))])
            dels = deletions(store, p)
            state = rederive(RollbackView(store, dels), settings, p, run_id, report)
            with store.unit([p.user_id], "forget"):   # readers see the forget whole or not at all
                touched = write(store, p, dels, state, report)
        report.seconds = time.perf_counter() - start
        for row in unfinished[1:]:
            store.upsert("runs", [{**row, "status": "completed", "finished_at": datetime.now(timezone.utc)}])
        owed = [] if keep_versions else unpurged(store)
        tables = set(touched).union(*(json.loads(r["counts_json"] or "{}").get("purge", []) for r in owed))
        status = "purging" if tables and not keep_versions else "completed"
        store.upsert("runs", [runs_row(report, status, started_at, done(intent(p, recorded)), tables)])
        # still under the run lease: a run waiting for it must not read a table the purge compacts and
        # whose old files it deletes meanwhile
        if status == "purging":   # recorded first: a purge that fails or dies is finished by the next forget
            purge(store, tables | {"runs"})
            report.purged = True
            now = datetime.now(timezone.utc)
            store.upsert("runs", [{**r, "status": "completed", "finished_at": now} for r in owed] +
                         [runs_row(report, "completed", started_at, done(intent(p, recorded)), tables)])
    report.bytes_after = dir_bytes(store.uri)
    report.seconds = time.perf_counter() - start
    return report


def done(what: dict[str, Any]) -> dict[str, Any]:
    """The intent as a finished forget keeps it: without the ids it forgot (counts say how many)."""
    return {k: v for k, v in what.items() if k not in ("message_ids", "sessions")}


# -- the intent: what a crashed forget left to do ---------------------------------------------------
def unfinished_intents(store: Store, user: str) -> list[dict[str, Any]]:
    """`runs` rows of forgets of this user that started and never completed, oldest first."""
    return forgets_started(store, [user]).get(user, [])


def finish_forgets(store: Store, settings: Settings, users: list[str] | None = None) -> list[ForgetReport]:
    """Finish the forgets a crash left `started` (of `users`, default every user) by forgetting their
    recorded scopes again (a forget of the user finishes its recorded intents: their message ids and
    rollback point too), purging included. A consolidation calls it under its run lease before it
    plans its shards: it must not consolidate again the messages such a forget was deleting."""
    out = []
    for user, rows in sorted(forgets_started(store, users).items()):
        scopes = [json.loads(r["counts_json"] or "{}").get("scope", {}) for r in rows]
        if any(sc.get("whole_user") for sc in scopes):
            out.append(forget(store, settings, user))
            continue
        cuts = [datetime.fromisoformat(sc["before"]) for sc in scopes if sc.get("before")]
        out.append(forget(store, settings, user, sessions=sorted({i for sc in scopes for i in sc.get("sessions", [])}),
                          messages=sorted({i for sc in scopes for i in sc.get("messages", [])}),
                          before=max(cuts, default=None)))
    return out


def merge_intents(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"message_ids": [], "sessions": []}
    for r in rows:
        c = json.loads(r["counts_json"] or "{}").get("intent", {})
        out["message_ids"] += c.get("message_ids", [])
        out["sessions"] += c.get("sessions", [])
        for key, pick in (("rollback_to", min), ("old_watermark", max)):
            if c.get(key):
                out[key] = pick(out[key], c[key]) if out.get(key) else c[key]
    return out


def intent(p: Plan, recorded: dict[str, Any]) -> dict[str, Any]:
    return {"message_ids": p.message_ids,
            "sessions": sorted(set(p.gone_sessions) | set(p.cut_sessions) | set(recorded.get("sessions", []))),
            "rollback_to": p.rollback.isoformat() if p.rollback else None,
            "old_watermark": p.watermark[0].isoformat() if p.watermark else None}


def runs_row(r: ForgetReport, status: str, started_at: datetime, what: dict[str, Any],
             purge_tables: Iterable[str] = ()) -> dict[str, Any]:
    counts = {"scope": r.scope, "intent": what, "deleted": r.deleted, "rederived": r.rederived,
              "sessions_rerun": r.sessions_rerun, "messages": r.messages, "purge": sorted(purge_tables)}
    return {"id": r.run_id, "kind": "forget", "status": status, "started_at": started_at,
            "finished_at": datetime.now(timezone.utc) if status == "completed" else None, "users": [r.user_id],
            "counts_json": json.dumps(counts, sort_keys=True), "llm_calls": r.llm_calls, "tokens_in": 0,
            "tokens_out": 0, "cache_hits": r.cache_hits, "quarantined": 0, "seconds": r.seconds,
            "backend": "", "model": ""}


# -- re-derivation ----------------------------------------------------------------------------------
def rederive(store: Store, settings: Settings, p: Plan, run_id: str, report: ForgetReport) -> ShardState | None:
    """Run every consolidation stage over the plan's sessions on top of the user's memory as of W."""
    if p.rollback is None or p.remaining == 0:
        return None
    report.rollback_to = p.rollback.isoformat()
    if p.watermark is None:   # nothing committed to redo: the next run consolidates every session
        return None
    state = rerun_state(store, p, run_id, settings.max_llm_attempts)
    report.sessions_rerun = len(state.sessions)
    embedder = ReuseEmbedder(embedder_for(settings), known_vectors(store, p))
    ctx = StageContext(store=store, settings=settings.with_overrides(rebuild_graph=False), run_id=run_id,
                       embedder=embedder)
    for spec in STAGES:
        state = spec.run(state, ctx)
    bank, rolled = load_bank(store, p.user_id, p.rollback)
    for t, v in zip(rolled, embedder.embed([t.text for t in rolled])):
        t.vector = v
    state.extra.setdefault("topics", [])[:0] = [t.row() for t in rolled]
    report.llm_calls = int(state.llm.get("calls", 0))
    report.cache_hits = int(state.llm.get("cache_hits", 0))
    report.vectors_reused = embedder.reused
    backend = backend_for(settings)
    report.scope["backend"] = f"{backend.name}/{backend.model}"
    return state


def known_vectors(store: Store, p: Plan) -> dict[str, np.ndarray]:
    """Stored vectors of the texts the re-run may embed again: the user's messages (as embedded,
    `memory.text.turn_text`) and memories of sessions after W."""
    out: dict[str, np.ndarray] = {}
    gone = set(p.message_ids)
    for r in store.read("messages", p.user_id, columns=["message_id", "speaker", "text", "vector"]).to_pylist():
        if r["vector"] is not None and r["message_id"] not in gone:
            out[turn_text(r["speaker"], r["text"])] = np.asarray(r["vector"], dtype=np.float32)
    for name in ("fragments", "insights", "summaries", "topics"):
        for r in store.read(name, p.user_id, columns=["text", "vector", "source_ids"]).to_pylist():
            if r["vector"] is not None and r["text"] and gone.isdisjoint(r["source_ids"] or []):
                out[r["text"]] = np.asarray(r["vector"], dtype=np.float32)
    return out


# -- the writes -------------------------------------------------------------------------------------
def deletions(store: Store, p: Plan) -> dict[str, set[str]]:
    """Ids of the rows the forget deletes outright or re-derives, per table (before feedback, rerankers,
    quarantine and cache, which depend on what the re-derivation rewrites)."""
    user = p.user_id
    dels: dict[str, set[str]] = {}
    if p.nothing_survives:   # every row of the user goes (the tables the
        for name in USER_TABLES:   # plan read come from `p.rows`, the others from the store)
            if store.has_table(name):
                rows = p.rows[name] if name in p.rows else store.read(name, user, columns=["id"]).to_pylist()
                dels[name] = {r["id"] for r in rows}
        return dels
    dels = rollback_ids(store, p) if p.rollback is not None else {}
    dels.setdefault("messages", set()).update(p.row_ids)
    dels.setdefault("observations", set()).update(p.tainted.get("observations", set()))
    dels.setdefault("sessions", set()).update(p.gone_session_rows)
    return dels


def write(store: Store, p: Plan, dels: dict[str, set[str]], state: ShardState | None,
          report: ForgetReport) -> set[str]:
    """Every write of one forget (the caller holds the write lease); returns the tables touched."""
    user = p.user_id
    dels = {k: set(v) for k, v in dels.items()}
    report.messages += settle_appends(store, p, dels)
    if p.whole_user:   # the tables appends write, read again under the write lease: their rows since the plan go too
        for name in APPENDED_TABLES:
            if store.has_table(name):
                dels.setdefault(name, set()).update(store.read(name, user, columns=["id"]).column("id").to_pylist())
    rewritten = {name: {r["id"] for r in rows} for name, rows in (state.extra if state else {}).items()}
    if state is not None:
        for name, rows in (("fragments", state.fragments), ("insights", state.insights)):
            rewritten[name] = {r["id"] for r in rows}
        rewritten["clusters"] = {c.id for c in state.clusters}
        rewritten["messages"] = {r["id"] for r in state.message_rows}
        rewritten["progress"] = {progress_id(user, s.session_id) for s in state.sessions} | {progress_id(user, None)}
    gone_memories = set(p.row_ids)
    for name in set(MEMORY_TABLES.values()) - {"messages"}:
        gone_memories |= dels.get(name, set()) - rewritten.get(name, set())
    dels["feedback"] = dels.get("feedback", set()) | feedback_ids(store, user, gone_memories)
    dels["rerankers"] = reranker_ids(store, user, dels["feedback"])
    dels["quarantine"] = quarantine_ids(store, p, dels)
    whole = p.nothing_survives          # the whole user's entries go: no memory ids to look up
    dels["llm_cache"] = set(ResponseCache(store).forget_rows(user, p.message_ids,
                                                             set() if whole else cache_memory_ids(p), whole_user=whole))
    touched = {name for name, ids in dels.items() if ids}
    for name, ids in dels.items():
        if ids and store.has_table(name):
            for chunk in _chunks(sorted(ids)):
                store.delete(name, col("id").isin(chunk))
        report.deleted[name] = len(ids - rewritten.get(name, set()))
    if p.cut_sessions and p.remaining:
        store.upsert("sessions", list(p.cut_sessions.values()))
        touched.add("sessions")
    if p.rollback is not None and p.remaining:
        store.upsert("clusters", cluster_resets(store, p))
        dead = set().union(*dels.values())
        for name in ("fragments", "insights"):
            store.upsert(name, pointer_resets(store, user, name, dels.get(name, set()), dead))
        if state is not None:
            written = commit(store, state)
            for name, n in {**written, **rederived_counts(state)}.items():
                if n:
                    report.rederived[name] = n
                    touched.add(name)
            if not state.sessions:
                mark = {"id": make_id("watermark", user), "user_id": user, "last_session_ts": p.rollback,
                        "sessions_done": p.done_at_rollback, "run_id": report.run_id,
                        "updated_at": datetime.now(timezone.utc)}
                if p.done_at_rollback:
                    store.upsert("watermarks", [mark])
                else:
                    store.delete("watermarks", user_filter(user))
                touched.add("watermarks")
    return touched


def rederived_counts(state: ShardState) -> dict[str, int]:
    """Rows the re-derivation wrote, per table (fragments also those whose validity it changed)."""
    out = {name: len({r["id"] for r in rows}) for name, rows in state.extra.items()}
    out["fragments"] = len({r["id"] for r in state.fragments} | {r["id"] for r in state.extra.get("fragments", [])})
    out.update(messages=len(state.message_rows), insights=len(state.insights), links=len(state.links),
               clusters=len({c.id for c in state.clusters} | {lk.pool.id for lk in state.links}))
    return out


def rollback_ids(store: Store, p: Plan) -> dict[str, set[str]]:
    """Ids of the user's derived rows after the rollback point W (and every tainted row); the tables
    `taint` read come from the plan (`p.rows`), the others from the store."""
    assert p.rollback is not None
    w, user = p.rollback, p.user_id
    out: dict[str, set[str]] = {k: set(v) for k, v in p.tainted.items() if k != "observations"}

    def after(name: str, column: str, profile: bool = False) -> set[str]:
        """Rows of `name` dated after W, and with `profile` the profile summaries (rebuilt whole)."""
        return {r["id"] for r in p.rows.get(name, []) if (r[column] is not None and r[column] > w)
                or (profile and r["level"] == "profile")}

    for name in ("fragments", "insights", "clusters", "graph_nodes"):
        out.setdefault(name, set()).update(after(name, "session_ts"))
    nodes = p.rows.get("graph_nodes", [])
    out["topics"] = out.get("topics", set()) | after("topics", "created_ts")
    rolled = {t.id for t in load_bank(store, user, w)[1]}
    out["topics"] -= rolled   # rewritten as they stood at W (history after W undone), not deleted
    out["summaries"] = out.get("summaries", set()) | after("summaries", "session_ts", profile=True)
    out["links"] = out.get("links", set()) | {
        r["id"] for r in p.rows.get("links", []) if {r["pool_cluster_id"], r["new_cluster_id"]} & out["clusters"]}
    dead = {r["node_id"] for r in nodes if r["id"] in out["graph_nodes"]}
    out["graph_edges"] = {r["id"] for r in store.read("graph_edges", user, columns=["id", "src_id", "dst_id"]).to_pylist()
                          if r["src_id"] in dead or r["dst_id"] in dead}
    gone = set(p.gone_sessions)
    out["progress"] = {r["id"] for r in store.read("progress", user, columns=["id", "session_id", "session_ts"]).to_pylist()
                       if r["session_id"] and ((r["session_ts"] is not None and r["session_ts"] > w)
                                               or r["session_id"] in gone)}
    return out


def cluster_resets(store: Store, p: Plan) -> list[dict[str, Any]]:
    """Clusters of sessions up to W that a later session consumed: back in the pool as of W."""
    assert p.rollback is not None
    rows = store.read("clusters", p.user_id).to_pylist()
    return [{**r, "consumed_ts": None, "consumed_by": None} for r in rows
            if r["session_ts"] <= p.rollback and r["consumed_ts"] is not None and r["consumed_ts"] > p.rollback]


def pointer_resets(store: Store, user: str, name: str, hidden: set[str], dead: set[str]) -> list[dict[str, Any]]:
    """Surviving rows whose validity pointers name a deleted memory, with those pointers cleared; a
    pointer naming a row stored nowhere is one too (a forget killed after deleting the messages and
    finished by the next one: the finishing forget no longer sees those rows among its deletions)."""
    t = store.read(name, user)
    pointers = [p for p, _ in POINTERS if p in t.column_names]
    if not t.num_rows or not pointers:
        return []
    stored = t.to_pylist()
    dead = dead | unstored(store, [user], {r[p] for r in stored for p in pointers if r[p]})
    rows = [r for r in stored if r["id"] not in hidden and any(r[p] in dead for p in pointers)]
    if not rows:
        return []
    return clear_pointers(pa.Table.from_pylist(rows, schema=t.schema), dead).to_pylist()


def cache_memory_ids(p: Plan) -> set[str]:
    """The reverse-index entries of tainted memories: their ids, and the hashes of topic summaries
    (the merge prompt quotes a new topic's summary by text; the topics as the plan read them)."""
    out = set().union(*p.tainted.values()) if p.tainted else set()
    ids = p.tainted.get("topics", set())
    for r in p.rows.get("topics", []):
        if r["id"] in ids:
            out.add(text_key(r["text"] or ""))
            for h in json.loads(r["history_json"] or "[]"):
                out |= {text_key(h.get("text") or ""), text_key(h.get("new_summary") or "")}
    return out


def _chunks(ids: list[str], size: int = 5000) -> Iterable[list[str]]:
    for i in range(0, len(ids), size):
        yield ids[i:i + size]
