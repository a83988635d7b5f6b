"""Committing a shard: the one place a consolidation writes. Every table first (the rows of the
first stages, then the deletions and rows the later stages asked for), the users' watermarks last,
so a crash before the watermarks leaves the sessions pending and the re-run rewrites the same rows
(row ids are deterministic)."""
from __future__ import annotations

from datetime import datetime, timezone

from memory.ids import make_id
from memory.stages.shard import Cluster, ShardState, timed
from memory.store import Store, users_filter


def commit(store: Store, state: ShardState) -> dict[str, int]:
    """Write the shard: every table first, then the watermarks. Safe to repeat."""
    with timed(state, "commit"):
        written = {
            "messages": store.upsert("messages", state.message_rows),
            "fragments": store.upsert("fragments", state.fragments),
            "clusters": store.upsert("clusters", [c.row(state.run_id) for c in touched_clusters(state)]),
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
    return written


def touched_clusters(state: ShardState) -> list[Cluster]:
    """New clusters plus pool clusters whose consumption this run recorded."""
    out = {c.id: c for c in state.clusters}
    for lk in state.links:
        out[lk.pool.id] = lk.pool
    return list(out.values())
