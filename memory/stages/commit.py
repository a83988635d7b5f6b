"""Committing a shard: the one place a consolidation writes. Every table first (the rows of the
first stages, then the rows the later stages asked for, then the deletions they asked for: a user's
rebuilt graph or phases replace the old rows only once the new ones are written, so a run killed in
between keeps the old ones, where it had left the user with none), then the quarantine rows of
retried work that is settled, the `progress` rows, and the users' watermarks last, so a crash
before the watermarks leaves the new sessions pending and the re-run rewrites the same rows (row ids
are deterministic). What the re-run does not write again (`leftovers`: it saw other sessions, a late
one among them, so it linked, wove or segmented differently) is deleted after its new rows are
written, as a forget rolls a user back: rows dated after the user's watermark, which only an
unfinished run writes, and the pool clusters it marked consumed.

`settle` turns the work the stages quarantined (`state.quarantined_work`) into the sessions' and
users' `progress` rows (items: see `memory.stages.load`): a retried item that succeeds is dropped
and its quarantine rows deleted; one quarantined again counts an attempt; at
`Settings.max_llm_attempts` (`state.max_attempts`) it is given up: kept, with its quarantine rows,
and not retried."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

from lancedb.expr import col, lit

from memory.ids import make_id, progress_id
from memory.stages.shard import Cluster, SessionWork, ShardState, active, timed
from memory.store import Store, users_filter


def commit(store: Store, state: ShardState) -> dict[str, int]:
    """Write the shard: every table, then progress, then the watermarks, as one unit for readers
    (`Store.unit`: they see all of it or none of it). Safe to repeat."""
    with timed(state, "commit"), store.unit(state.users, label=f"commit {state.run_id}"):
        left = leftovers(store, state)                 # read before this run's rows are written
        written = {
            "messages": store.upsert("messages", state.message_rows),
            "fragments": store.upsert("fragments", state.fragments),
            "clusters": store.upsert("clusters", [c.row(state.run_id) for c in touched_clusters(state)]),
            "links": store.upsert("links", [lk.row(state.run_id) for lk in state.links]),
            "insights": store.upsert("insights", state.insights),
            "quarantine": store.upsert("quarantine", state.quarantine),
        }
        for name, rows in state.extra.items():
            written[name] = written.get(name, 0) + store.upsert(name, rows)
        for name, users in state.replace.items():   # after the new rows: a crash in between leaves the
            new = [r["id"] for r in state.extra.get(name, [])]    # old ones too, never none of either
            store.delete(name, users_filter(users) & ~col("id").isin(new) if new else users_filter(users))
        drop_leftovers(store, state, left)
        now = datetime.now(timezone.utc)
        progress, settled = settle(state, now)
        if settled and store.has_table("quarantine"):
            store.delete("quarantine", col("id").isin(settled))
        written["progress"] = store.upsert("progress", progress)
        written["sessions"] = pin_session_times(store, state)
        marks = []
        for user in state.users:
            mine = [s for s in state.sessions if s.user_id == user]
            if not mine:
                continue
            last, done = state.watermarks[user]
            marks.append({"id": make_id("watermark", user), "user_id": user,
                          "last_session_ts": max([last] + [s.ts for s in mine]),
                          "sessions_done": done + sum(s.first for s in mine),
                          "run_id": state.run_id, "updated_at": now})
        written["watermarks"] = store.upsert("watermarks", marks)
    return written


#: tables of rows dated by session (or creation, for topics): a row dated after its user's watermark
#: was written by a run that died before its watermarks (`leftovers`); every session after the
#: watermark is consolidated again as new (`memory.stages.load`), so a fragment the re-run does not
#: write again belongs to a session gone (forgotten) or answered otherwise
DATED = {"fragments": "session_ts", "insights": "session_ts", "clusters": "session_ts", "graph_nodes": "session_ts", "summaries": "session_ts",
         "topics": "created_ts"}


def leftovers(store: Store, state: ShardState) -> dict[str, list[dict[str, Any]]]:
    """Rows an unfinished run left of the users this shard consolidates sessions of, read before the
    shard's rows are written: per table of `DATED`, the rows dated after the user's watermark (not a
    profile, rewritten whole, whose failed re-synthesis keeps the last one), and as "consumed" the
    pool clusters of sessions up to it marked consumed after it. One read per table for the shard;
    none finds a row after a run that committed."""
    users = sorted({s.user_id for s in state.sessions})
    if not users:
        return {}
    marks = {u: state.watermarks[u][0] for u in users}
    since = lit(min(marks.values()) - timedelta(days=1))       # a coarse filter, then the exact one
    out: dict[str, list[dict[str, Any]]] = {}
    for name, when in DATED.items():
        if not store.has_table(name):
            continue
        cols = ["id", "user_id", when] + {"graph_nodes": ["node_id"], "summaries": ["level"]}.get(name, [])
        cond = col(when) > since
        if name == "clusters":
            cond = cond | (col("consumed_ts") > since)
        rows = store.read(name, columns=None if name == "clusters" else cols,
                          where=users_filter(users) & cond).to_pylist()
        out[name] = [r for r in rows if r[when] > marks[r["user_id"]] and r.get("level") != "profile"]
        if name == "clusters":
            out["consumed"] = [r for r in rows if r[when] <= marks[r["user_id"]]
                               and r["consumed_ts"] is not None and r["consumed_ts"] > marks[r["user_id"]]]
    return out


def drop_leftovers(store: Store, state: ShardState, left: dict[str, list[dict[str, Any]]]) -> None:
    """Delete what `leftovers` found and this run did not write again, with the temporal edges and
    links that touch such a node or cluster (an edge from the last old node to the dead run's first
    one); put the pool clusters it consumed and this run did not back in the pool."""
    if not any(left.values()):
        return
    users = users_filter(sorted({s.user_id for s in state.sessions}))
    touched = {c.id for c in touched_clusters(state)}
    own = {"fragments": state.fragments, "insights": state.insights}
    for name in DATED:
        new = {r["id"] for r in state.extra.get(name, []) + own.get(name, [])} | (
            touched if name == "clusters" else set())
        dead = sorted(r["id"] for r in left.get(name, []) if r["id"] not in new)
        if dead:
            store.delete(name, users & col("id").isin(dead))
    ends = {"graph_edges": (["src_id", "dst_id"], sorted({r["node_id"] for r in left.get("graph_nodes", [])}),
                            {r["id"] for r in state.extra.get("graph_edges", [])}),
            "links": (["pool_cluster_id", "new_cluster_id"], sorted(r["id"] for r in left.get("clusters", [])),
                      {lk.id for lk in state.links})}
    for name, (sides, ids, new) in ends.items():
        if ids and store.has_table(name):
            t = store.read(name, columns=["id"], where=users & (col(sides[0]).isin(ids) | col(sides[1]).isin(ids)))
            if dead := sorted(set(t.column("id").to_pylist()) - new):
                store.delete(name, users & col("id").isin(dead))
    reset = [{**r, "consumed_ts": None, "consumed_by": None} for r in left.get("consumed", [])
             if r["id"] not in touched]
    if reset:
        store.upsert("clusters", reset)


def pin_session_times(store: Store, state: ShardState) -> int:
    """Give the sessions consolidated for the first time back the time their memories carry when
    their row moved meanwhile (a turn dated before their first one appended during the run): a
    consolidated session keeps one time (`memory.ingest.write.consolidated_sessions`)."""
    firsts = {make_id(s.user_id, s.session_id): s for s in state.sessions if s.first}
    if not firsts or not store.has_table("sessions"):
        return 0
    moved = [{**r, "ts": firsts[r["id"]].ts} for r in store.read_ids("sessions", sorted(firsts)).to_pylist()
             if r["user_id"] == firsts[r["id"]].user_id and r["ts"] != firsts[r["id"]].ts]
    return store.upsert("sessions", moved) if moved else 0


def touched_clusters(state: ShardState) -> list[Cluster]:
    """New clusters plus pool clusters whose consumption this run recorded."""
    out = {c.id: c for c in state.clusters}
    for lk in state.links:
        out[lk.pool.id] = lk.pool
    return list(out.values())


# -- progress -------------------------------------------------------------------------------------
def settle(state: ShardState, now: datetime) -> tuple[list[dict[str, Any]], list[str]]:
    """The progress rows this shard's commit writes and the quarantine row ids it deletes (those of
    retried work that succeeded or was quarantined again under another id); sets `state.outcome`."""
    written_q = {q["id"] for q in state.quarantine}
    rows = [row_of(r, state.run_id, now) for r in state.migrate]
    deleted: list[str] = []
    outcome = {"pending": 0, "given_up": 0, "retried": 0, "recovered": 0}
    keys: list[tuple[str, str]] = [(s.user_id, s.session_id) for s in state.sessions]
    users = [u for u in state.users if any(k[0] == u for k in keys) or u in state.summary_retry
             or (u, "") in state.quarantined_work]
    by_key = {(s.user_id, s.session_id): s for s in state.sessions}
    for key in keys + [(u, "") for u in users]:
        s = by_key.get(key)
        old = None if s is not None and s.first else state.progress.get(key)
        retried: list[dict[str, Any]] = []
        if s is not None:
            retried = s.retrying
        elif old is not None and key[0] in state.summary_retry:
            retried = [i for i in active(old["items"]) if i["work"] == "summarize"]
        fresh = state.quarantined_work.get(key, {})
        items, gave_up, again = settle_items(old["items"] if old else [], retried, fresh, seq_range(s, old),
                                             state.max_attempts)
        deleted += [q for i in retried for q in i["quarantine_ids"] if q not in written_q]
        outcome["retried"] += bool(retried)
        outcome["recovered"] += bool(retried) and not again
        outcome["given_up"] += bool(gave_up)
        outcome["pending"] += bool(active(items))
        row: dict[str, Any] = {"id": progress_id(*key), "user_id": key[0], "session_id": key[1] or None,
                               "items": items}
        if s is None:
            row.update(session_ts=None, n_messages=None, next_seq=None)
        elif s.mode in ("topics", "reason") and old is not None:
            row.update(session_ts=s.ts, n_messages=old["n_messages"], next_seq=old["next_seq"])
        else:
            reached = max(seq_range(s, old)[1], (old or {}).get("next_seq") or 0)
            row.update(session_ts=s.ts, n_messages=s.n_messages, next_seq=reached)
        rows.append(row_of(row, state.run_id, now))
    state.outcome = outcome
    return rows, deleted


def seq_range(s: SessionWork | None, old: dict[str, Any] | None) -> tuple[int, int]:
    """The [first, end) seq range of the messages a session's work covered this run."""
    seqs = [int(m.get("seq") or 0) for m in s.messages] if s is not None else []
    if seqs:
        return min(seqs), max(seqs) + 1
    start = int((old or {}).get("next_seq") or 0)
    return start, start


def settle_items(items: list[dict[str, Any]], retried: list[dict[str, Any]], fresh: dict[str, list[str]],
                 covered: tuple[int, int], max_attempts: int) -> tuple[list[dict[str, Any]], int, int]:
    """The items after a run: those not retried kept, retried ones that succeeded dropped, fresh
    quarantines (`work[:subject]` -> quarantine ids) added or counted as one more attempt of the
    item they retried; at `max_attempts` an item is given up. Returns (items, how many were given up,
    how many retried items were quarantined again)."""
    out = [i for i in items if i not in retried]
    gave_up = again = 0
    for work, qids in sorted(fresh.items()):
        kind, _, subject = work.partition(":")
        prev = next((i for i in retried if i["work"] == kind and i.get("subject", "") == subject), None)
        item: dict[str, Any]
        if prev is None:
            item = {"work": kind, "subject": subject, "from": covered[0], "to": covered[1], "attempts": 1}
        else:
            item = {**prev, "to": max(prev["to"], covered[1]), "attempts": prev["attempts"] + 1}
            again += 1
        item["quarantine_ids"] = sorted(set(qids))
        if item["attempts"] >= max_attempts:
            item["given_up"] = True
            gave_up += 1
        out.append(item)
    return out, gave_up, again


def row_of(r: dict[str, Any], run_id: str, now: datetime) -> dict[str, Any]:
    """A `progress` table row from a row with parsed items."""
    items = r["items"]
    status = "pending" if active(items) else "given_up" if items else "done"
    return {"id": r["id"], "user_id": r["user_id"], "session_id": r["session_id"], "session_ts": r["session_ts"],
            "n_messages": r["n_messages"], "next_seq": r["next_seq"], "status": status,
            "pending_json": json.dumps(items, sort_keys=True), "run_id": run_id, "updated_at": now}
