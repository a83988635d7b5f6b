"""One shard of users consolidated without Prefect: `load_shard`, every stage of
`memory.stages.STAGES` in order, then `commit` (see `memory.stages`)."""
from __future__ import annotations

from memory.settings import Settings
from memory.stages import STAGES
from memory.stages.commit import commit
from memory.stages.load import load_shard
from memory.stages.shard import ShardState, StageContext
from memory.store import Store


def has_work(state: ShardState, settings: Settings) -> bool:
    """Whether the shard's stages (and its commit) have anything to do: pending sessions, users whose
    summaries a quarantine left pending, progress rows to migrate, or a rebuild of the users' graphs."""
    return bool(state.sessions or state.summary_retry or state.migrate) or settings.rebuild_graph


def run_shard(store: Store, users: list[str], settings: Settings, run_id: str) -> ShardState:
    """All stages for one shard, in order, then its commit."""
    state = load_shard(store, users, run_id, settings)
    if not has_work(state, settings):
        return state
    ctx = StageContext.create(store, settings, run_id)
    for spec in STAGES:
        state = spec.run(state, ctx)
    commit(store, state)
    return state
