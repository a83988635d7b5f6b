"""Running consolidation over a store without Prefect, and the run record every command leaves.

`flows/` runs the same stages as Prefect tasks; this module is what tests, benchmarks and a
plain `python -c` use, and what both share: shard planning, run ids and the run summary.
"""
from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from memory.embed import embedder_for
from memory.ids import validate_user_id
from memory.lease import run_lease
from memory.pipeline import run_shard
from memory.resources import backend_for
from memory.settings import Settings
from memory.stages.shard import ShardState
from memory.store import Store

log = logging.getLogger(__name__)


def new_run_id(kind: str) -> str:
    return f"{kind}-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"


def open_store(settings: Settings) -> Store:
    """The store of these settings, sized for their embedder, its writes waiting up to
    `settings.write_lease_wait_s` for the store's writer lease."""
    return Store(settings.store, dim=embedder_for(settings).dim, write_lease_wait_s=settings.write_lease_wait_s)


def plan_shards(store: Store, users: list[str] | None, shard_size: int) -> list[list[str]]:
    """Users (all with messages, or the given ones) cut into shards of `shard_size`."""
    chosen = sorted({validate_user_id(u) for u in users}) if users else store.users()
    size = max(1, shard_size)
    return [chosen[i:i + size] for i in range(0, len(chosen), size)]


#: the keys of `RunReport.outcome`
OUTCOMES = ("pending", "given_up", "retried", "recovered")


@dataclass
class RunReport:
    """What one consolidation run did: counts, LLM use, time per stage, and what became of
    quarantined work (`outcome`).

    `status`: `completed`; `quarantined` when the run set LLM work aside (`counts["quarantined"]`) or
    left sessions (or users' summaries) pending or given up (`outcome`, see
    `memory.stages.load`); `failed` when a shard failed (set by the flow).
    """

    run_id: str
    kind: str
    backend: str
    model: str
    users: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    llm: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    status: str = "completed"
    started_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    #: sessions (and users' summaries) left `pending` after a quarantine, `given_up` at the retry cap,
    #: `retried` from an earlier run's quarantine, and `recovered` (retried, nothing quarantined again)
    outcome: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))

    def add(self, state: ShardState) -> None:
        self.users.extend(u for u in state.users if u not in self.users)
        for k, v in state.counts().items():
            self.counts[k] = self.counts.get(k, 0) + v
        for k, v in state.llm.items():
            self.llm[k] = self.llm.get(k, 0) + v
        for k, seconds in state.timings.items():
            self.timings[k] = self.timings.get(k, 0.0) + seconds
        for k, v in state.outcome.items():
            self.outcome[k] = self.outcome.get(k, 0) + v
        if self.status == "completed" and (self.counts.get("quarantined", 0) or self.outcome.get("pending", 0)
                                           or self.outcome.get("given_up", 0)):
            self.status = "quarantined"

    def quarantine_summary(self) -> str:
        """What became of quarantined work, e.g. `2 sessions pending retry, 1 given up`; "" when nothing."""
        o = {k: self.outcome.get(k, 0) for k in OUTCOMES}
        parts = [f"{o['pending']} sessions pending retry"] if o["pending"] else []
        parts += [f"{o['given_up']} given up"] if o["given_up"] else []
        parts += [f"{o['recovered']} of {o['retried']} retried recovered"] if o["retried"] else []
        return ", ".join(parts)

    def summary(self) -> str:
        c, llm = self.counts, self.llm
        stages = ", ".join(f"{k} {v:.1f}s" for k, v in self.timings.items())
        return (f"{self.kind} {self.run_id}: {c.get('users', 0)} users with new sessions, "
                f"{c.get('sessions', 0)} sessions, {c.get('messages', 0)} messages, "
                f"{c.get('fragments', 0)} fragments, {c.get('clusters', 0)} clusters, {c.get('links', 0)} links, "
                f"{c.get('insights', 0)} insights, {c.get('quarantined', 0)} quarantined"
                + (f" ({q})" if (q := self.quarantine_summary()) else "") + "; "
                f"LLM {self.backend}/{self.model}: {llm.get('calls', 0)} calls, "
                f"{llm.get('tokens_in', 0) + llm.get('tokens_out', 0)} tokens, {llm.get('cache_hits', 0)} cache hits; "
                f"{self.seconds:.1f}s" + (f" ({stages})" if stages else ""))

    def runs_row(self) -> dict[str, Any]:
        return {
            "id": self.run_id, "kind": self.kind, "status": self.status, "started_at": self.started_at,
            "finished_at": datetime.now(timezone.utc), "users": self.users,
            "counts_json": json.dumps({**self.counts, **self.outcome}, sort_keys=True),
            "llm_calls": self.llm.get("calls", 0),
            "tokens_in": self.llm.get("tokens_in", 0), "tokens_out": self.llm.get("tokens_out", 0),
            "cache_hits": self.llm.get("cache_hits", 0), "quarantined": self.counts.get("quarantined", 0),
            "seconds": self.seconds, "backend": self.backend, "model": self.model,
        }


def new_report(kind: str, settings: Settings, run_id: str | None = None) -> RunReport:
    """An empty report of a new run, naming the run's LLM backend and model."""
    backend = backend_for(settings)
    return RunReport(run_id=run_id or new_run_id(kind), kind=kind, backend=backend.name, model=backend.model)


def consolidate(
    store: Store, settings: Settings, users: list[str] | None = None, *, run_id: str | None = None,
    kind: str = "consolidate", on_shard: Callable[[ShardState], None] | None = None,
    shards: list[list[str]] | None = None,
) -> RunReport:
    """Consolidate every user's sessions newer than its watermark, shard by shard, no Prefect.

    `shards`: the `plan_shards(store, users, settings.shard_size)` the caller already made (else
    planned here). Holds the store's run lease (`memory.lease`) throughout: while another run holds
    it, waits up to `settings.run_lease_wait_s`, then raises `RunInProgressError`."""
    with run_lease(store.uri, settings.run_lease_wait_s):
        start = time.perf_counter()
        report = new_report(kind, settings, run_id)
        if shards is None:
            shards = plan_shards(store, users, settings.shard_size)
        for shard in shards:
            state = run_shard(store, shard, settings, report.run_id)
            report.add(state)
            if on_shard:
                on_shard(state)
        report.seconds = time.perf_counter() - start
        store.upsert("runs", [report.runs_row()])
        log.info(report.summary())
        return report
