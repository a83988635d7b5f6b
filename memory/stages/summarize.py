"""The summarize stage, MemWeaver cognitive memory (Yu et al., §3.3.2 and §3.3.3): phase summaries and a
global profile.

Each user's fragments, in time order, are split into phases at semantic breakpoints: for every gap
between two consecutive fragments, the cosine between the mean vector of the `WINDOW` fragments
before it and of the `WINDOW` after it; a gap is a breakpoint candidate when that similarity is a
local minimum and lies `DROP_STD` standard deviations below the user's mean (a significant drop).
Candidates are accepted deepest first while every phase keeps at least `MIN_PHASE` fragments; a
phase still longer than `MAX_PHASE` is then split at its deepest admissible gap until none is.

One LLM request per phase (Table 4: a local summary), all phases of the shard in one batch; a phase's
request lists the memories about the user, not those citing only an assistant's turns
(`RetrievalSettings.assistant_speakers`: its advice, most fragments of an assistant chat, which a
`rules` summary and hence the profile in every context() had quoted); then one
request per user (Table 5: the global profile, at most 300 words, checked) over the user's local
summaries, oldest first, as a second batch: all of them, or the most recent ones when they exceed
`PROFILE_MAX_CHARS` characters in all, so the request does not grow without bound. Summaries are
memory rows of the `summaries` table (level `phase` or `profile`), embedded, with `source_ids` = the
messages their fragments cite, so the retriever can search them (kind `summary`).

Incremental (§3.3.3): only the new fragments of a run are segmented and summarized (a run's batch
never merges with an older phase), unless one sorts (`Node.order`) before the last member of the
last stored phase (a late session, or messages appended to an older session): then the user is
re-segmented in time order, and a phase whose members did not change (hence its id) keeps its
stored row, asked nothing (unless this run closed one of its members: `stale_phases`); a phase's
prompt names no position, so one asked again with the same members (`--rebuild-graph`) is answered
from the LLM cache. The profile is then re-synthesized from the local summaries, old and new.
Phases of sessions newer than the watermark are ignored when reading, and `commit` deletes those a
re-run after a crash does not write again, so it converges. A user whose stored fragments are not
all covered by phases (an older store) and every user on `Settings.rebuild_graph` is re-segmented
from scratch. A quarantined phase summary or profile leaves the user's summaries pending
(`memory.stages.load`): a later run summarizes the fragments outside every stored phase as new
phases and re-synthesizes the profile.
"""
from __future__ import annotations

import logging
from datetime import datetime
from typing import AbstractSet, Any

import numpy as np
import polars as pl
from lancedb.expr import col

from memory import prompts
from memory.graph import Node, stored_ids, stored_nodes, with_stored
from memory.ids import make_id
from memory.read import PROFILE_KEY
from memory.segments import breakpoints
from memory.stages.shard import (ShardState, StageContext, add_rows, frame, has_stored, new_nodes,
                                 quarantine_work, replace_user, timed, users_to_update)
from memory.store import Store
from memory.text import cites_only, said_by

log = logging.getLogger(__name__)

MIN_PHASE = 8
MAX_PHASE = 40
WINDOW = 3
DROP_STD = 0.5

#: the profile request reads the most recent phase summaries of at most this many characters in all
#: (`recent`: about 4,000 tokens; a phase summary has at most 4,000 characters)
PROFILE_MAX_CHARS = 16_000
#: what a phase request adds to a replaced fragment it must still quote (every member was replaced)
REPLACED = " (replaced since)"
#: a user's plan: (user, its stored phase rows, its new phases as (request context, nodes))
Plan = tuple[str, list[dict[str, Any]], list[tuple[dict[str, Any], list[Node]]]]


# -- the stage --------------------------------------------------------------------------------------
def summarize(state: ShardState, ctx: StageContext) -> ShardState:
    """Summarize the shard's new phases (one LLM batch), then re-synthesize each profile (another)."""
    with timed(state, "summarize"):
        users = set(users_to_update(state, ctx.settings, ("fragment",))) | set(state.summary_retry)
        plans = [plan_user(state, ctx, user) for user in state.users if user in users]
        resegmented = set(state.replace.get("summaries", []))      # their profile too, all phases kept or not
        if any(p or u in resegmented for u, _, p in plans) or state.summary_retry:
            write_summaries(state, ctx, plans)
    return state


def plan_user(state: ShardState, ctx: StageContext, user: str) -> Plan:
    """The user's stored phases to keep and new phases to summarize (all of them on a re-segmentation,
    but for those whose members did not change: their stored rows are kept, `reused`).

    A user whose summaries a quarantine left pending (`state.summary_retry`) also gets its stored
    fragments outside every stored phase summarized as new phases (and its profile again)."""
    store = ctx.store
    until = state.watermarks[user][0]
    stored = has_stored(state, user)
    batch = new_nodes(state, user, ("fragment",))
    rebuild = ctx.settings.rebuild_graph
    old_rows: list[dict[str, Any]] = []
    before: list[dict[str, Any]] = []         # the stored phases a re-segmentation may keep
    if not rebuild and stored:
        old = stored_phases(store, user, until)
        covered = int(old["n_items"].sum()) if old.height else 0
        if user in state.summary_retry:
            inside = {m for ms in old["member_ids"].to_list() for m in ms} if old.height else set()
            known = {n.id for n in batch}
            batch += [n for n in stored_nodes(store, user, until, ("fragment",))
                      if n.id not in inside and n.id not in known]
            old_rows = old.to_dicts()
        elif covered != len(stored_ids(store, user, until, ("fragment",))):
            log.info("user %s has fragments outside its phases: re-segmenting", user)
            rebuild, before = True, old.to_dicts()
        elif batch and old.height and sorts_inside(store, user, batch, old):
            log.info("user %s has fragments dated inside its phases (a late or reopened session): "
                     "re-segmenting in time order", user)
            rebuild, before = True, old.to_dicts()
        else:
            old_rows = old.to_dicts()
    if rebuild:
        replace_user(state, "summaries", user)
        if stored:
            batch = with_stored(batch, store, user, until, ("fragment",))
    batch.sort(key=Node.order)
    phases, kept = [], []
    if batch:
        said = assistant_turns(state, ctx, user, batch)
        closed = superseded(state, ctx, user, batch)
        keep = reusable(state, user, before)
        for a, b in segment(np.stack([n.vector for n in batch])):
            c = phase_context(user, batch[a:b], said, closed)
            if c["phase_id"] in keep:
                kept.append(c["phase_id"])
            else:
                phases.append((c, batch[a:b]))
    if kept:                     # written again: the re-segmentation's replace deletes what it does not write
        rows = store.read("summaries", user, where=col("id").isin(kept)).to_pylist()
        add_rows(state, "summaries", rows)
        old_rows = sorted(rows, key=lambda r: (r["start_ts"], r["end_ts"], r["id"]))
    return user, old_rows, phases + stale_phases(state, ctx, user, old_rows)


def reusable(state: ShardState, user: str, rows: list[dict[str, Any]]) -> set[str]:
    """Ids of the stored phase `rows` a re-segmentation keeps when it finds them again (the same
    members, hence the same id): not those with a member this run's supersede stage closed, which
    `stale_phases` would summarize again anyway."""
    now = closed_now(state, user)
    return {r["id"] for r in rows if not now & set(r["member_ids"])}


def closed_now(state: ShardState, user: str) -> set[str]:
    """Ids of the user's fragments this run's supersede stage closed."""
    return {r["id"] for r in state.extra.get("fragments", []) if r.get("user_id") == user and r.get("superseded_by")}


def sorts_inside(store: Store, user: str, batch: list[Node], phases: pl.DataFrame) -> bool:
    """Whether a new fragment sorts (`Node.order`) before the last member of the stored `phases`:
    dated before the end of the last phase, or at that time and ordered before its last member (read
    only then)."""
    first, end = min(n.order() for n in batch), max(phases["end_ts"].to_list())
    if first[0] != end:
        return bool(first[0] < end)
    last = phases.filter(pl.col("end_ts") == end).to_dicts()
    members = stored_nodes(store, user, end, ("fragment",), ids={m for r in last for m in r["member_ids"]})
    return first < max((n.order() for n in members), default=first)


def stale_phases(state: ShardState, ctx: StageContext, user: str,
                 old_rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[Node]]]:
    """The stored phases (`old_rows`) with a member this run's supersede stage closed, to summarize
    again under their own ids (reading only their members): a phase summary must not state a value
    replaced since. `write_summaries` keeps a stored row whose new summary failed."""
    now = closed_now(state, user)
    stale = [r for r in old_rows if now & set(r["member_ids"])]
    if not stale:
        return []
    members = {n.id: n for n in stored_nodes(ctx.store, user, state.watermarks[user][0], ("fragment",),
                                             ids={m for r in stale for m in r["member_ids"]})}
    every = list(members.values())           # one read each for all the stale phases' members
    said, closed = assistant_turns(state, ctx, user, every), superseded(state, ctx, user, every)
    out = []
    for row in stale:
        nodes = sorted((members[m] for m in row["member_ids"] if m in members), key=Node.order)
        if nodes:
            c = phase_context(user, nodes, said, closed)
            out.append(({**c, "phase_id": row["id"]}, nodes))
    log.info("user %s: %d stored phase(s) hold a fragment replaced in this run: summarized again", user, len(out))
    return out


def assistant_turns(state: ShardState, ctx: StageContext, user: str, nodes: list[Node]) -> set[str]:
    """Ids of the turns `nodes` cite that an assistant said (`RetrievalSettings.assistant_speakers`):
    from the shard's sessions, and from the stored messages only for the sources outside them (a
    re-segmentation's older fragments), so a nightly run reads no history."""
    voices = ctx.settings.retrieval.assistant_speakers
    if not voices:
        return set()
    mine = [m for s in state.sessions if s.user_id == user for m in s.messages]
    said = said_by(mine, voices)
    missing = sorted({sid for n in nodes for sid in n.source_ids} - {m["message_id"] for m in mine})
    if missing and has_stored(state, user):
        stored = ctx.store.read("messages", user, columns=["message_id", "speaker"],
                                where=col("message_id").isin(missing))
        said |= said_by(stored.to_pylist(), voices)
    return said


def summarized(nodes: list[Node], said: set[str], closed: AbstractSet[str] = frozenset()) -> list[Node]:
    """The nodes a phase summary reads: all but those citing only assistant turns (`said`), which
    paraphrase the assistant's advice rather than the user's history (on assistant chats most
    fragments are; a `rules` summary quoted them), and those a newer fragment replaced (`closed`: the
    profile in every context() quoted a replaced goal as current); every node when none would be left."""
    return [n for n in nodes if not cites_only(n.source_ids, said) and n.id not in closed] or nodes


def superseded(state: ShardState, ctx: StageContext, user: str, nodes: list[Node]) -> set[str]:
    """Ids of `nodes` a newer fragment replaced: in this run (the shard's fragments, the stored ones
    the supersede stage closed) or before (read only for the stored nodes outside the shard)."""
    ids = {n.id for n in nodes}
    now = {r["id"]: r.get("superseded_by") for r in state.fragments + state.extra.get("fragments", [])
           if r.get("user_id") == user}
    closed = {i for i, by in now.items() if by and i in ids}
    older = sorted(ids - set(now))
    if older and has_stored(state, user):
        t = ctx.store.read("fragments", user, columns=["id", "superseded_by"], where=col("id").isin(older))
        closed |= {r["id"] for r in t.to_pylist() if r["superseded_by"]}
    return closed


def write_summaries(state: ShardState, ctx: StageContext, plans: list[Plan]) -> None:
    """The phase batch, then the profile batch; both kinds of rows embedded and added to the shard."""
    with ctx.llm(state) as runner:
        backend = runner.backend
        meta = dict(run_id=state.run_id, backend=backend.name, model=backend.model)
        requests = [prompts.summarize_request(c) for _, _, phases in plans for c, _ in phases]
        answers, bad = runner.run(requests, validate=lambda a, _: prompts.validate_summary(a))
        it = iter(answers)
        new_rows: list[dict[str, Any]] = []
        profile_plans = []
        for user, old_rows, phases in plans:
            mine = []
            for (c, nodes), answer in zip(phases, it):
                if answer is not None:
                    mine.append(phase_row(c, nodes, prompts.parse_summary(answer), **meta))
            new_rows += mine
            latest = {r["id"]: r for r in old_rows + mine}      # a phase summarized again replaces its row
            every = recent(sorted(latest.values(), key=lambda r: (r["start_ts"], r["end_ts"], r["id"])))
            if every:
                profile_plans.append((user, every))
        for q in bad:
            user = q.request.context["user_id"]
            quarantine_work(state, q.row(user, state.run_id, q.request.context["phase_id"]), user, "", "summarize")
        preq = [prompts.profile_request({"user_id": user, "summaries": [
            {"id": r["id"], "start": _day(r["start_ts"]), "end": _day(r["end_ts"]), "text": r["content"]}
            for r in every]}) for user, every in profile_plans]
        panswers, pbad = runner.run(preq, validate=lambda a, _: prompts.validate_profile(a))
    state.llm["memweaver_requests"] = state.llm.get("memweaver_requests", 0) + len(requests) + len(preq)
    profiles = [profile_row(user, every, prompts.parse_profile(a), **meta)
                for (user, every), a in zip(profile_plans, panswers) if a is not None]
    for q in pbad:
        user = q.request.context["user_id"]
        quarantine_work(state, q.row(user, state.run_id, "profile"), user, "", "summarize")
    rows = new_rows + profiles
    if rows:
        vecs = ctx.embedder.embed([r["text"] for r in rows])
        for r, v in zip(rows, vecs):
            r["vector"] = v
        add_rows(state, "summaries", rows)


def recent(phases: list[dict[str, Any]], budget: int = PROFILE_MAX_CHARS) -> list[dict[str, Any]]:
    """The phases (oldest first) whose summaries the profile request reads: the most recent ones whose
    summaries fit in `budget` characters (at least the last), so the request does not grow with the
    history; the profile row names them as its members."""
    out: list[dict[str, Any]] = []
    for r in reversed(phases):
        budget -= len(r["content"])
        if out and budget < 0:
            break
        out.append(r)
    return out[::-1]


def stored_phases(store: Store, user: str, until: datetime) -> pl.DataFrame:
    """The user's stored phase rows of sessions up to `until`, oldest first."""
    t = frame(store.read("summaries", user, columns=[
        "id", "level", "session_id", "session_ts", "start_ts", "end_ts", "content", "n_items", "source_ids",
        "member_ids"]))
    if t.height == 0:
        return t
    return t.filter((pl.col("level") == "phase") & (pl.col("session_ts") <= until)).sort(["start_ts", "end_ts", "id"])


# -- segmentation ---------------------------------------------------------------------------------
def gap_similarities(vectors: np.ndarray, window: int = WINDOW) -> np.ndarray:
    """sims[g-1] = cos(mean(v[g-w:g]), mean(v[g:g+w])) for every gap g = 1..n-1."""
    n = len(vectors)
    out = np.zeros(max(0, n - 1), dtype=np.float64)
    for g in range(1, n):
        a = vectors[max(0, g - window):g].mean(axis=0)
        b = vectors[g:g + window].mean(axis=0)
        out[g - 1] = float(a @ b) / max(float(np.linalg.norm(a) * np.linalg.norm(b)), 1e-12)
    return out


def segment(vectors: np.ndarray, min_size: int = MIN_PHASE, max_size: int = MAX_PHASE,
            window: int = WINDOW, drop_std: float = DROP_STD) -> list[tuple[int, int]]:
    """Phases as [start, end) ranges over time-ordered vectors (see the module docstring)."""
    n = len(vectors)
    if n < 2 * min_size:            # no cut could leave min_size on both sides
        return [(0, n)] if n else []
    sims = gap_similarities(vectors, window)
    return breakpoints(sims, sims.mean() - drop_std * sims.std(), min_size, max_size, local_minima=True)


# -- rows -------------------------------------------------------------------------------------------
def _day(ts: datetime) -> str:
    return ts.strftime("%Y-%m-%d")


def date_range(start: datetime, end: datetime) -> str:
    return _day(start) if _day(start) == _day(end) else f"{_day(start)} to {_day(end)}"


def _sources(nodes: list[Node]) -> list[str]:
    return list(dict.fromkeys(s for n in nodes for s in n.source_ids))


def phase_context(user: str, nodes: list[Node], said: set[str] | None = None,
                  closed: AbstractSet[str] = frozenset()) -> dict[str, Any]:
    """The summary request's context for one phase of `nodes`: its items are the memories about the
    user that still hold (`summarized`; `said`: the assistant's turn ids, `closed`: replaced fragments)."""
    items = summarized(nodes, said or set(), closed)
    return {"user_id": user, "phase_id": make_id(user, "phase", prompts.SUMMARIZE_VERSION, *[n.id for n in nodes]),
            "start": _day(nodes[0].session_ts), "end": _day(nodes[-1].session_ts),
            "items": [{"id": n.id, "date": n.date or _day(n.session_ts),     # a phase of replaced values only
                       "text": n.text + (REPLACED if n.id in closed else "")} for n in items]}


def phase_row(ctx: dict[str, Any], nodes: list[Node], summary: str, *, run_id: str, backend: str,
              model: str) -> dict[str, Any]:
    start, end = nodes[0].session_ts, nodes[-1].session_ts
    key = f"phase {date_range(start, end)}"
    return {"id": ctx["phase_id"], "user_id": ctx["user_id"], "level": "phase", "session_id": nodes[-1].session_id,
            "session_ts": end, "start_ts": start, "end_ts": end, "key": key, "content": summary,
            "date": date_range(start, end), "text": f"{key}: {summary}", "member_ids": [n.id for n in nodes],
            "n_items": len(nodes), "source_ids": _sources(nodes), "run_id": run_id, "backend": backend,
            "model": model, "prompt_version": prompts.SUMMARIZE_VERSION}


def profile_row(user: str, phases: list[dict[str, Any]], profile: str, *, run_id: str, backend: str,
                model: str) -> dict[str, Any]:
    start = min(p["start_ts"] for p in phases)
    end = max(p["end_ts"] for p in phases)
    sources = list(dict.fromkeys(s for p in phases for s in p["source_ids"]))
    last = max(phases, key=lambda p: p["end_ts"])
    return {"id": make_id(user, "profile"), "user_id": user, "level": "profile", "session_id": last["session_id"],
            "session_ts": end, "start_ts": start, "end_ts": end, "key": PROFILE_KEY, "content": profile,
            "date": date_range(start, end), "text": profile, "member_ids": [p["id"] for p in phases],
            "n_items": len(phases), "source_ids": sources, "run_id": run_id, "backend": backend, "model": model,
            "prompt_version": prompts.PROFILE_VERSION}
