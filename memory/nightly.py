"""Whether a consolidation run has anything to do, decided from a few small tables before anything
heavy starts (Prefect, the embedder, an LLM): a nightly run with nothing new ends in well under 2 s.

A user may owe work (the check errs only that way: `memory.stages.load` decides exactly what) when
it has a session newer than its watermark, a session without a `progress` row (a late one) or with
more messages than its row counted (an append), a progress row with work pending a retry, a
watermark without the user's own progress row (a store to migrate), or a forget a crash left
`started` or `purging` (`forgets_started`: the run finishes it before it consolidates the user). The reranker owes
a version when feedback is newer than the latest version of its scope. Reads: `watermarks`,
`progress` and `sessions` (a few columns; one row per session, not per message) and, when they
exist, the forget rows of `runs` and the `feedback` and `rerankers` timestamps.
"""
from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
from lancedb.expr import col, lit

from memory.ids import validate_user_id
from memory.store import Store, users_filter

#: the watermark of a user never consolidated
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _rows(store: Store, name: str, columns: list[str], users: list[str] | None) -> list[dict[str, Any]]:
    if not store.has_table(name):
        return []
    t: pa.Table = store.read(name, columns=columns, where=users_filter(users) if users else None)
    return t.to_pylist()


def _active(pending_json: str | None) -> bool:
    return any(not i.get("given_up") for i in json.loads(pending_json or "[]"))


def pending_users(store: Store, users: list[str] | None = None) -> list[str]:
    """The users (all, or the given ones) that may owe consolidation work, sorted; [] when none does."""
    chosen = sorted({validate_user_id(u) for u in users}) if users else None
    marks = {r["user_id"]: (r["last_session_ts"], r["sessions_done"] or 0)
             for r in _rows(store, "watermarks", ["user_id", "last_session_ts", "sessions_done"], chosen)}
    progress: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in _rows(store, "progress", ["user_id", "session_id", "n_messages", "pending_json"], chosen):
        progress[r["user_id"]][r["session_id"] or ""] = r
    out: set[str] = set()
    for r in _rows(store, "sessions", ["user_id", "session_id", "ts", "n_messages"], chosen):
        user = r["user_id"]
        last, done = marks.get(user, (EPOCH, 0))
        row = progress[user].get(r["session_id"]) if done else None
        if row is None or r["ts"] > last or (r["n_messages"] or 0) > (row["n_messages"] or 0):
            out.add(user)
    for user, (_, done) in marks.items():
        rows = progress.get(user, {})
        if done and "" not in rows:   # consolidated before progress was tracked: migrated on load
            out.add(user)
        if done and any(_active(r["pending_json"]) for r in rows.values()):
            out.add(user)
    out.update(forgets_started(store, chosen, ("started", "purging")))
    return sorted(out)


def forget_runs(store: Store, statuses: tuple[str, ...], columns: list[str] | None = None) -> list[dict[str, Any]]:
    """The `runs` rows of forgets in one of `statuses` ("started": a crash between their intent and
    their last write; "purging": their purge never finished), oldest first."""
    if not store.has_table("runs"):
        return []
    rows = store.read("runs", columns=None if columns is None else sorted({*columns, "started_at"}),
                      where=(col("kind") == lit("forget")) & col("status").isin(list(statuses))).to_pylist()
    return sorted(rows, key=lambda r: r["started_at"])


def forgets_started(store: Store, users: list[str] | None = None,
                    statuses: tuple[str, ...] = ("started",)) -> dict[str, list[dict[str, Any]]]:
    """`forget_runs` of `statuses` per user (of `users`, default every user), oldest first."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in forget_runs(store, statuses):
        for user in r["users"] or []:
            if not users or user in users:
                out[user].append(r)
    return dict(out)


def new_feedback(store: Store, scope: str = "global", users: list[str] | None = None) -> bool:
    """Whether feedback newer than the latest reranker version of its scope exists (`scope` "global":
    one version for everyone; else one per user), i.e. whether the run would train a version. A run
    of some `users` trains only their versions: never the global one (it learns from everyone)."""
    if not store.has_table("feedback") or (users and scope == "global"):
        return False
    fb = _rows(store, "feedback", ["user_id", "created_at"], sorted(set(users)) if users else None)
    if not fb:
        return False
    latest: dict[str, tuple[int, datetime]] = {}
    for r in _rows(store, "rerankers", ["scope", "version", "feedback_until"], None):
        if r["scope"] not in latest or r["version"] > latest[r["scope"]][0]:
            latest[r["scope"]] = (r["version"], r["feedback_until"])
    for r in fb:
        key = "global" if scope == "global" else f"user:{r['user_id']}"
        until = latest.get(key, (0, EPOCH))[1]
        if until is None or r["created_at"] > until:
            return True
    return False
