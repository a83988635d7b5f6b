"""Running consolidation over a store without Prefect, and the run record every command leaves.

`flows/` runs the same stages as Prefect tasks; this module is what tests, benchmarks and a
plain `python -c` use, and what both share: shard planning, run ids, the run summary, the embedder
check, and compaction (`memory.nightly` decides, cheaply, whether a run has anything to do). The
stages are imported only when a run consolidates, so a run with nothing to do stays light.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Iterable

from memory.embed import check_embedder, embedder_for
from memory.ids import new_run_id, validate_user_id
from memory.lease import run_lease
from memory.nightly import forgets_started, pending_users
from memory.settings import Settings
from memory.store import Store
from memory.units import UNITS

if TYPE_CHECKING:
    from memory.stages.shard import ShardState

log = logging.getLogger(__name__)


def open_store(settings: Settings) -> Store:
    """The store of these settings, sized for their embedder, its writes waiting up to
    `settings.write_lease_wait_s` for the store's writer lease."""
    return Store(settings.store, dim=embedder_for(settings).dim, write_lease_wait_s=settings.write_lease_wait_s,
                 lease_backend=settings.lease_backend, lease_ttl_s=settings.lease_ttl_s)


def finish_forgets(store: Store, settings: Settings, users: list[str] | None = None) -> list[str]:
    """Finish the forgets of `users` (default every user) a crash left `started`, and the purges of any
    left `purging`, before a run plans its shards (`memory.forget.finish_forgets`, `finish_purges`; the
    caller holds the run lease); their summaries."""
    if not forgets_started(store, users, ("started", "purging")):
        return []
    from memory.forget import finish_forgets as finish
    from memory.forget_purge import finish_purges

    out = [f"finished a forget a crash had left unfinished: {r.summary()}" for r in finish(store, settings, users)]
    if purged := finish_purges(store):
        out.append(f"finished the purge of {purged} forget(s) a crash had left purging")
    return out


def plan_shards(store: Store, users: list[str] | None, shard_size: int, *, everyone: bool = False) -> list[list[str]]:
    """The users (of `users`, default all) that may owe work (`memory.nightly.pending_users`: a few
    small reads, so a nightly run over many users costs what its users with new sessions cost), cut
    into shards of `shard_size`. `everyone` (a graph rebuild): every given user, else every user with
    messages."""
    if everyone:
        chosen = sorted({validate_user_id(u) for u in users}) if users else store.users()
    else:
        chosen = pending_users(store, users)
    size = max(1, shard_size)
    return [chosen[i:i + size] for i in range(0, len(chosen), size)]


#: the keys of `RunReport.counts` (`ShardState.counts`), zero in a run whose users had nothing to do
COUNTS = ("users", "sessions", "messages", "fragments", "clusters", "links", "insights", "quarantined")
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
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    llm: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    status: str = "completed"
    started_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    #: sessions (and users' summaries) left `pending` after a quarantine, `given_up` at the retry cap,
    #: `retried` from an earlier run's quarantine, and `recovered` (retried, nothing quarantined again)
    outcome: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    #: the store's data files after the run's compaction (`compact`), printed after the summary
    compaction: str = ""

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
    from memory.resources import backend_for

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
    it, waits up to `settings.run_lease_wait_s`, then raises `RunInProgressError`. Under it, first
    finishes the forgets of its users a crash left unfinished (`finish_forgets`): consolidating the
    messages such a forget was deleting would make them memory again."""
    from memory.pipeline import run_shard

    with run_lease(store.uri, settings.run_lease_wait_s, settings.lease_backend, settings.lease_ttl_s):
        start = time.perf_counter()
        report = new_report(kind, settings, run_id)
        check_embedder(store, embedder_for(settings))
        for line in (finished := finish_forgets(store, settings, users)):
            log.warning("%s", line)
        if finished:   # they changed what is pending
            shards = None
        if shards is None:
            shards = plan_shards(store, users, settings.shard_size, everyone=settings.rebuild_graph)
        for shard in shards:
            state = run_shard(store, shard, settings, report.run_id)
            report.add(state)
            if on_shard:
                on_shard(state)
        report.seconds = time.perf_counter() - start
        store.upsert("runs", [report.runs_row()])
        report.compaction = compact(store, settings, compacted_tables(report), always=kind == "backfill")
        log.info(report.summary())
        return report


#: tables every consolidation writes (compaction looks only at these and `runs`)
WRITTEN = ("messages", "fragments", "clusters", "links", "insights", "quarantine", "progress", "watermarks",
           "topics", "summaries", "graph_nodes", "graph_edges", "runs", "llm_cache", "sessions")


def compact(store: Store, settings: Settings, tables: Iterable[str] = WRITTEN, *, always: bool = False) -> str:
    """Compact after a run: every one of `tables` with more than `settings.compact_max_fragments` data
    fragments (every table, `always`: after a backfill), deleting versions created over
    `settings.cleanup_older_than_s` ago; the commit marker's old versions too (`units`: one row in one
    fragment, but a version and a file per unit published, and every snapshot reads the table). Returns
    the line the run prints: data files per table, bytes."""
    if not always:                        # `always` takes every table, the marker's among them
        store.optimize([UNITS], min_fragments=0, cleanup_older_than_s=settings.cleanup_older_than_s)
    done = store.optimize(None if always else tables, min_fragments=0 if always else settings.compact_max_fragments,
                          cleanup_older_than_s=settings.cleanup_older_than_s)
    return files_line(store.data_files(), done)


def compacted_tables(report: RunReport) -> tuple[str, ...]:
    """What a run may have grown: every table it writes when it consolidated sessions, else `runs`."""
    return WRITTEN if report.counts.get("sessions", 0) or report.outcome.get("retried", 0) else ("runs",)


def files_line(files: dict[str, tuple[int, int]], compacted: list[str]) -> str:
    """`store: 31 data files, 95.2 MB (fragments 2, messages 3, ...); compacted fragments, messages`."""
    n = sum(f for f, _ in files.values())
    size = sum(b for _, b in files.values())
    per = ", ".join(f"{name} {f}" for name, (f, _) in files.items())
    return (f"store: {n} data files, {size / 1e6:.1f} MB ({per}); "
            + (f"compacted {', '.join(compacted)}" if compacted else "nothing compacted"))
