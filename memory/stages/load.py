"""Loading a shard: each user's pending sessions with their messages and observations, and the user's
cluster pool as of its watermark (with, for a session dated before it, the clusters consumed since
that session's time). The one stage without a context: it runs before the others and
only reads the store.

The watermark (a user's newest consolidated session time) says which sessions are new; it cannot
say which older ones still owe work. The `progress` table does (see `schemas.progress`): one row
per consolidated session with the message count and `next_seq` it got to and the LLM work a
quarantine set aside (items), one row per user for its phase summaries and profile. A session is:

* **new** (after the watermark, or a late one: dated before it, never consolidated): every stage
  over all its messages, as before progress was tracked. A progress row of a session after the
  watermark is ignored: it can only come from a run that died before writing the watermarks.
* **reopened**, mode `full`: messages were appended since (`sessions.n_messages` above the row's
  `n_messages`) or its extraction is pending. Every stage runs over the messages from the pending
  extraction's first `seq` (else from `next_seq`) on, so cost follows the new work; fragments,
  clusters and topics of those messages get new deterministic ids beside the old ones.
* mode `topics`: only the topic requests of quarantined subjects, over the messages of their
  attempt (deferred while the session also has messages to extract).
* mode `reason`: only the reason requests of quarantined links (`retry_links` loads them and their
  clusters as stored); no messages. Any mode but `new` also retries the session's pending links.
* done: nothing loaded. A user with nothing pending costs two small reads (its sessions and
  progress rows) besides the watermark.

A pending `summarize` item of the user (a quarantined phase summary or profile) puts the user in
`state.summary_retry`. An item is `{"work", "subject", "from", "to", "attempts", "quarantine_ids",
"given_up"}`: work `extract`, `topics` (one per subject), `reason` (one per link id) or `summarize`,
the `seq` range it covers and the runs that quarantined it; `commit.settle` updates them.

A store consolidated before progress was tracked (a watermark, no user row) is migrated on its
first load: messages already embedded count as consolidated, the rest is pending, and quarantine
rows of summaries, and of extraction and topics with nothing stored since, become pending items.
"""
from __future__ import annotations

import json
from collections.abc import Collection
from datetime import datetime, timezone
from typing import Any

import numpy as np
import polars as pl
from lancedb.expr import col

from memory.ids import progress_id, validate_user_id
from memory.settings import Settings
from memory.stages.shard import Cluster, Link, SessionWork, ShardState, active, frame, timed
from memory.store import Store

#: the watermark of a user never consolidated
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

#: quarantine `stage` (LLM task) -> the pending work it leaves
WORK_OF_TASK = {"extract": "extract", "topics": "topics", "summarize": "summarize", "profile": "summarize"}

#: (session row, mode, first seq, end seq or None, items retried)
Planned = tuple[dict[str, Any], str, int, int | None, list[dict[str, Any]]]


def load_shard(store: Store, users: list[str], run_id: str, settings: Settings | None = None) -> ShardState:
    """Pending sessions of each user, their messages and the pool as of the user's watermark.

    `settings` give the retry cap of quarantined work (`max_llm_attempts`; defaults otherwise)."""
    state = ShardState(run_id=run_id, users=[validate_user_id(u) for u in users],
                       max_attempts=(settings or Settings()).max_llm_attempts)
    with timed(state, "load"):
        for user in state.users:
            load_user(store, state, user)
    return state


def load_user(store: Store, state: ShardState, user: str) -> None:
    """One user's watermark, pending sessions with their messages, and live pool clusters."""
    wm = store.read("watermarks", user)
    last, done = (wm.column("last_session_ts")[0].as_py(), wm.column("sessions_done")[0].as_py()) \
        if wm.num_rows else (EPOCH, 0)
    state.watermarks[user] = (last, done)
    sessions = frame(store.read("sessions", user))
    known = read_progress(store, user) if done else {}
    if done and "" not in known:  # consolidated before progress was tracked: migrated once
        known = legacy_progress(store, user, sessions, last)
        state.migrate.extend(known.values())
    planned: list[Planned] = []
    for s in sessions.sort(["ts", "session_id"]).iter_rows(named=True):
        plan = plan_session(s, known, last)
        if plan is not None:
            planned.append((s, *plan))
            if plan[0] != "new":
                state.progress[(user, s["session_id"])] = known[s["session_id"]]
    if "" in known:
        state.progress[(user, "")] = known[""]
        if any(i["work"] == "summarize" for i in active(known[""]["items"])):
            state.summary_retry.append(user)
    if not planned:
        return
    add_sessions(store, state, user, planned)
    clusters = frame(store.read("clusters", user))
    if clusters.height:
        live = clusters.filter((pl.col("session_ts") <= last) &
                               (pl.col("consumed_ts").is_null() | (pl.col("consumed_ts") > last)))
        state.pools[user] = [Cluster.from_row(r) for r in live.sort(["session_ts", "id"]).iter_rows(named=True)]
        early = [s["ts"] for s, *_ in planned if s["ts"] < last]
        if early:   # live at an early session's time, consumed by a session up to the watermark since
            since = clusters.filter((pl.col("session_ts") <= last) & (pl.col("consumed_ts") <= last) &
                                    (pl.col("consumed_ts") > min(early)))
            state.consumed[user] = [Cluster.from_row(r, consumption=True)
                                    for r in since.sort(["session_ts", "id"]).iter_rows(named=True)]
    retry_links(store, state, user)


def retry_links(store: Store, state: ShardState, user: str) -> None:
    """The stored links whose reason request a quarantine left pending, for the reason stage to ask
    again (their clusters as stored, consumption included). A link no longer stored (forgotten) is
    not asked: its item is settled as done."""
    ids = sorted({i for s in state.sessions if s.user_id == user for i in s.reason_links})
    if not ids:
        return
    rows = store.read_ids("links", ids).to_pylist()
    wanted = {c for r in rows for c in (r["pool_cluster_id"], r["new_cluster_id"])}
    clusters = {r["id"]: Cluster.from_row(r, consumption=True)
                for r in store.read_ids("clusters", sorted(wanted)).to_pylist() if r["user_id"] == user}
    for r in rows:
        pool, new = clusters.get(r["pool_cluster_id"]), clusters.get(r["new_cluster_id"])
        if r["user_id"] == user and pool is not None and new is not None:
            state.links.append(Link(pool=pool, new=new, similarity=float(r["similarity"])))


def add_sessions(store: Store, state: ShardState, user: str, planned: list[Planned]) -> None:
    """The planned sessions with their messages (of the planned `seq` range) and observations.

    A new session's messages are all (re)embedded and written; a reopened one's only those never
    embedded, the others keep their stored vectors (carried in the session's messages)."""
    wanted = sorted({p[0]["session_id"] for p in planned})   # read only these sessions, not the whole history
    msgs = frame(store.read("messages", user, where=col("session_id").isin(wanted))).sort(["session_id", "seq"])
    obs = (frame(store.read("observations", user, where=col("session_id").isin(wanted)))
           if any(p[0]["observed"] and p[1] not in ("topics", "reason") for p in planned) else None)
    by_session = {k[0]: g for k, g in msgs.group_by(["session_id"], maintain_order=True)}
    for s, mode, start, end, retrying in planned:
        group = by_session.get(s["session_id"])
        rows = group.to_dicts() if group is not None else []
        if mode != "new":
            rows = [r for r in rows if r["seq"] >= start and (end is None or r["seq"] < end)]
        if mode == "new":
            state.message_rows.extend(rows)
        elif mode == "full":
            state.message_rows.extend(r for r in rows if r["vector"] is None)
        observations = None
        if s["observed"] and obs is not None and mode not in ("topics", "reason"):
            observations = obs.filter(pl.col("session_id") == s["session_id"]).to_dicts()
            if mode == "full":  # a reopened session: the observations of its new messages
                ids = {r["message_id"] for r in rows}
                observations = [o for o in observations if ids & set(o["source_ids"] or [])]
        messages = []
        for r in rows:
            m = {"message_id": r["message_id"], "speaker": r["speaker"], "text": r["text"], "ts": r["ts"],
                 "seq": r["seq"], "utc_offset_min": r.get("utc_offset_min")}
            if mode != "new" and r["vector"] is not None:
                m["vector"] = np.asarray(r["vector"], dtype=np.float32)
            messages.append(m)
        state.sessions.append(SessionWork(
            user_id=user, session_id=s["session_id"], ts=s["ts"], messages=messages,
            observed=bool(s["observed"]), observations=observations, mode=mode,
            n_messages=int(s["n_messages"] or len(rows)), retrying=retrying))


# -- progress: what each session owes -------------------------------------------------------------
def read_progress(store: Store, user: str) -> dict[str, dict[str, Any]]:
    """The user's progress rows by session id ("" for the user's own row), items parsed."""
    out = {}
    for r in store.read("progress", user).to_pylist():
        r["items"] = json.loads(r.pop("pending_json") or "[]")
        out[r["session_id"] or ""] = r
    return out


def plan_session(s: dict[str, Any], known: dict[str, dict[str, Any]],
                 watermark: datetime) -> tuple[str, int, int | None, list[dict[str, Any]]] | None:
    """(mode, first seq, end seq or None, items retried) for one session row, or None when it owes
    nothing. Mode `new` is a first consolidation, `full` a reopened session, `topics` a topic retry
    (with the session's pending reason links), `reason` a retry of those links alone."""
    p = known.get(s["session_id"]) if s["ts"] <= watermark else None
    if p is None:
        return "new", 0, None, []
    items = active(p["items"])
    extract = [i for i in items if i["work"] == "extract"]
    if extract or (s["n_messages"] or 0) > (p["n_messages"] or 0):
        return "full", min([i["from"] for i in extract] + [p["next_seq"] or 0]), None, extract + [
            i for i in items if i["work"] == "reason"]
    reasons = [i for i in items if i["work"] == "reason"]
    topics = [i for i in items if i["work"] == "topics"]
    if topics:
        lo, hi = min((i["from"], i["to"]) for i in topics)
        return "topics", lo, hi, [i for i in topics if (i["from"], i["to"]) == (lo, hi)] + reasons
    if reasons:
        return "reason", 0, 0, reasons
    return None


def legacy_progress(store: Store, user: str, sessions: pl.DataFrame,
                    watermark: datetime) -> dict[str, dict[str, Any]]:
    """Progress rows for a user consolidated before progress was tracked (read once, on its first
    load): per session up to the watermark, its embedded messages as consolidated and its quarantined
    extraction or topics (none stored since) as pending items; the user's own row with its
    quarantined summaries. Sessions without an embedded message get no row: never consolidated,
    they are late sessions."""
    msgs = frame(store.read("messages", user, columns=["session_id", "seq", "embed_model"]))
    done = msgs.filter(pl.col("embed_model").is_not_null()).group_by("session_id").agg(
        n=pl.len(), next_seq=pl.col("seq").max() + 1)
    reach = {r["session_id"]: r for r in done.iter_rows(named=True)}
    have = {("extract", sid, "") for sid in store.read("fragments", user, columns=["session_id"])
            .column("session_id").to_pylist()}
    have |= {("topics", r["session_id"], r["subject"]) for r in
             store.read("topics", user, columns=["session_id", "subject"]).to_pylist()}
    quarantined: dict[str, list[dict[str, Any]]] = {}
    known = set(sessions["session_id"].to_list()) | set(reach)
    for q in store.read("quarantine", user, columns=["id", "stage", "source"]).to_pylist():
        named = work_named(q["stage"], q["source"], known)
        if named is None:
            continue
        work, sid, subject = named
        if (work, sid, subject) not in have:
            quarantined.setdefault(sid, []).append({"work": work, "subject": subject, "qid": q["id"]})
    out: dict[str, dict[str, Any]] = {}
    for s in sessions.filter(pl.col("ts") <= watermark).iter_rows(named=True):
        r = reach.get(s["session_id"])
        if r is None:
            continue
        out[s["session_id"]] = legacy_row(user, s["session_id"], s["ts"], int(r["n"]), int(r["next_seq"]),
                                          quarantined.get(s["session_id"], []))
    out[""] = legacy_row(user, None, None, None, None, quarantined.get("", []))
    return out


def work_named(stage: str | None, source: str | None, sessions: Collection[str]) -> tuple[str, str, str] | None:
    """(work, session id, subject) of a quarantine row of LLM work (None: no session's work). An extract
    row's source is its session id, a topics row's `session/subject`; either may hold a `/` itself, so
    the session is the longest of `sessions` that opens the source (else the part before its last `/`)."""
    work, source = WORK_OF_TASK.get(stage or ""), source or ""
    if work == "extract":
        return work, source, ""
    if work == "topics":
        cut = len(source)
        while (cut := source.rfind("/", 0, cut)) > 0:     # the longest known session first
            if source[:cut] in sessions:
                return work, source[:cut], source[cut + 1:]
        sid, _, subject = source.rpartition("/")
        return work, sid, subject
    if work == "summarize":
        return work, "", ""
    return None


def legacy_row(user: str, session_id: str | None, ts: datetime | None, n: int | None, next_seq: int | None,
               quarantined: list[dict[str, Any]]) -> dict[str, Any]:
    items: dict[tuple[str, str], dict[str, Any]] = {}
    for q in quarantined:
        item = items.setdefault((q["work"], q["subject"]), {
            "work": q["work"], "subject": q["subject"], "from": 0, "to": next_seq or 0, "attempts": 1,
            "quarantine_ids": []})
        item["quarantine_ids"].append(q["qid"])
    return {"id": progress_id(user, session_id), "user_id": user, "session_id": session_id, "session_ts": ts,
            "n_messages": n, "next_seq": next_seq, "items": list(items.values())}
