"""Loading a shard: each user's pending sessions (newer than its watermark), their messages and
observations, and the user's cluster pool as of the watermark. The one stage without a context: it
runs before the others and only reads the store."""
from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import polars as pl

from memory.ids import validate_user_id
from memory.stages.shard import Cluster, SessionWork, ShardState, frame, timed
from memory.store import Store

#: the watermark of a user never consolidated
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def load_shard(store: Store, users: list[str], run_id: str) -> ShardState:
    """Pending sessions (newer than each user's watermark), their messages and the pool as of it."""
    state = ShardState(run_id=run_id, users=[validate_user_id(u) for u in users])
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
    sessions = frame(store.read("sessions", user)).filter(pl.col("ts") > last).sort(["ts", "session_id"])
    if sessions.height == 0:
        return
    msgs = frame(store.read("messages", user)).filter(
        pl.col("session_id").is_in(sessions["session_id"].to_list())).sort(["session_id", "seq"])
    obs = frame(store.read("observations", user)) if sessions["observed"].any() else None
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
    clusters = frame(store.read("clusters", user))
    if clusters.height:
        live = clusters.filter((pl.col("session_ts") <= last) &
                               (pl.col("consumed_ts").is_null() | (pl.col("consumed_ts") > last)))
        state.pools[user] = [Cluster(
            id=r["id"], user_id=user, session_id=r["session_id"], session_ts=r["session_ts"],
            member_ids=list(r["member_ids"]), centroid=np.asarray(r["centroid"], dtype=np.float32),
        ) for r in live.sort(["session_ts", "id"]).iter_rows(named=True)]
