"""Checking a store for what concurrent writers or interrupted runs can leave behind, and repairing it.

- `duplicate_ids`: rows sharing one `id` in a table (two processes `merge_insert`-ing the same new id
  at once both insert, lancedb#2463; the writer lease of `memory.lease` prevents it, a store written
  without it may hold some). Once an id is duplicated every later upsert of it matches both rows.
- `missing_sources`: memory rows (fragments, insights, topics, summaries, observations) whose
  `source_ids` name messages that do not exist for their user.
- `remove_duplicates`: keeps one copy of every duplicated id (the last written, by row address) and
  deletes the others by row id in one delete per table, under the writer lease, so no other writer
  (nor a compaction, which moves rows) comes in between the read and the delete, and a crash loses
  nothing (no delete-then-re-add window).

- `unstored_terms`: searchable rows without stored BM25 terms (`schemas.TERMS`: rows an older mnemo
  wrote, whose user's first query then tokenizes them); `store_terms` rewrites them, and the store
  works their terms out on the write.

- `session_mismatches`: sessions whose row disagrees with their stored messages (a row counting fewer
  or more turns, or no row: an append that raced a forget in an older mnemo); the next consolidation
  reads a session's work from its row, so such turns are never made memory. `remake_sessions` writes
  each such row again from the messages (count, speakers, first time), and the next run consolidates
  what its progress has not covered.

- `unfinished_forgets`: forget runs recorded `started` or `purging` (a forget that died: the forgotten
  text may still be on disk until the next consolidation of its users, or their next forget, finishes it).

- `dangling_pointers`: fragments and insights whose validity (`superseded_by`, `contradicts`) names a
  row stored nowhere, which keeps a current value closed; `clear_dangling` resets them, as a forget
  does for what it deletes.

`check(store, fix=...)` runs them all; `mnemo doctor [--fix]` prints it.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import polars as pl
from lancedb.expr import col

from memory import schemas
from memory.ingest.common import OBSERVATIONS_SCHEMA
from memory.ingest.validate import sessions_frame
from memory.ingest.write import consolidated_sessions
from memory.nightly import forget_runs
from memory.pointers import POINTERS, clear_pointers, unstored
from memory.store import Store

#: the column naming the messages a memory row comes from
SOURCES = "source_ids"


def _tables(store: Store, tables: list[str] | None) -> list[str]:
    present = set(store.table_names())
    return sorted(present if tables is None else present & set(tables))


def duplicate_ids(store: Store, tables: list[str] | None = None) -> dict[str, dict[str, int]]:
    """{table: {id: copies}} for every id held by more than one row (all tables, or `tables`)."""
    out: dict[str, dict[str, int]] = {}
    for name in _tables(store, tables):
        counts = Counter(store.read(name, columns=["id"]).column("id").to_pylist())
        dups = {key: n for key, n in counts.items() if n > 1}
        if dups:
            out[name] = dict(sorted(dups.items()))
    return out


def missing_sources(store: Store, tables: list[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """{table: [{"id", "user_id", "missing": [message ids]}]} for the rows whose `source_ids` name a
    message their user does not have."""
    messages: dict[str, set[str]] = defaultdict(set)
    if store.has_table("messages"):
        t = store.read("messages", columns=["user_id", "message_id"])
        for user, mid in zip(t.column("user_id").to_pylist(), t.column("message_id").to_pylist()):
            messages[user].add(mid)
    out: dict[str, list[dict[str, Any]]] = {}
    for name in _tables(store, tables):
        if SOURCES not in store.table(name).schema.names:
            continue
        t = store.read(name, columns=["id", "user_id", SOURCES])
        bad = []
        for rid, user, sources in zip(t.column("id").to_pylist(), t.column("user_id").to_pylist(),
                                      t.column(SOURCES).to_pylist()):
            missing = [s for s in dict.fromkeys(sources or []) if s not in messages.get(user, ())]
            if missing:
                bad.append({"id": rid, "user_id": user, "missing": missing})
        if bad:
            out[name] = bad
    return out


def remove_duplicates(store: Store, tables: list[str] | None = None) -> dict[str, int]:
    """Delete every copy but the last written of each duplicated id; {table: rows deleted}."""
    removed: dict[str, int] = {}
    for name in _tables(store, tables):
        with store.write_lease():  # nothing writes or compacts (moves rows) between read and delete
            t = store.read(name, columns=["id", "_rowid", "_rowaddr"])
            ids = t.column("id").to_pylist()
            counts = Counter(ids)
            if all(n == 1 for n in counts.values()):
                continue
            keep: dict[str, tuple[int, int]] = {}   # id -> (row address, row id) of the copy kept
            extra: list[int] = []
            for key, rowid, addr in zip(ids, t.column("_rowid").to_pylist(), t.column("_rowaddr").to_pylist()):
                if counts[key] == 1:
                    continue
                kept = keep.get(key)
                if kept is None or addr > kept[0]:
                    if kept is not None:
                        extra.append(kept[1])
                    keep[key] = (addr, rowid)
                else:
                    extra.append(rowid)
            store.delete(name, col("_rowid").isin(extra))
            removed[name] = len(extra)
    return removed


def unstored_terms(store: Store, tables: list[str] | None = None) -> dict[str, int]:
    """{table: rows without stored BM25 terms} over the searchable tables."""
    out: dict[str, int] = {}
    for name in _tables(store, tables):
        if name in schemas.MEMORY_TABLES.values():
            if n := store.read(name, columns=["id"], null=schemas.TERMS).num_rows:
                out[name] = n
    return out


#: rows rewritten per upsert by `store_terms`
TERMS_BATCH = 10_000


def store_terms(store: Store, tables: list[str] | None = None) -> dict[str, int]:
    """Rewrite the rows without stored BM25 terms (the store adds them on write), a batch at a time,
    each read and rewritten under the writer lease so no other write comes in between; {table: rows}."""
    done: dict[str, int] = {}
    for name in _tables(store, tables):
        while name in schemas.MEMORY_TABLES.values():
            with store.write_lease():
                rows = store.read(name, null=schemas.TERMS, limit=TERMS_BATCH)
                if rows.num_rows:
                    store.upsert(name, rows)
            if not rows.num_rows:
                break
            done[name] = done.get(name, 0) + rows.num_rows
    return done


def _session_frames(store: Store) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(sessions made from the stored messages, the stored session rows), per (user, session)."""
    if not store.has_table("messages") or not store.has_table("sessions"):
        return pl.DataFrame(), pl.DataFrame()
    msgs = pl.from_arrow(store.read("messages", columns=["user_id", "session_id", "seq", "speaker", "ts"]))
    made = sessions_frame(msgs.with_columns(archive=pl.lit(None, pl.String)),  # type: ignore[union-attr]
                          pl.DataFrame(schema=OBSERVATIONS_SCHEMA), "")
    return made, pl.from_arrow(store.read("sessions"))  # type: ignore[return-value]


def session_mismatches(store: Store) -> list[dict[str, Any]]:
    """{user_id, session_id, stored, row} for every session whose row's message count is not the
    number of its stored messages (`row` None: no row)."""
    made, rows = _session_frames(store)
    if made.height == 0:
        return []
    both = made.select("user_id", "session_id", stored="n_messages").join(
        rows.select("user_id", "session_id", row="n_messages"), on=["user_id", "session_id"], how="left")
    return both.filter(pl.col("row").is_null() | (pl.col("row") != pl.col("stored"))).sort(
        "user_id", "session_id").to_dicts()


def remake_sessions(store: Store, mismatched: list[dict[str, Any]]) -> int:
    """Write the `mismatched` sessions' rows again from their stored messages (an existing row keeps
    its archive and `observed`, and a consolidated one its time: `consolidated_sessions`), under the
    writer lease; returns how many."""
    with store.write_lease():
        made, rows = _session_frames(store)
        keys = pl.DataFrame(mismatched).select("user_id", "session_id")
        fresh = made.join(keys, on=["user_id", "session_id"]).drop("archive", "observed")
        kept = rows.select("user_id", "session_id", "archive", "observed")   # (typed even when empty)
        settled = pl.DataFrame([(u, s, ts) for (u, s), ts in consolidated_sessions(store, keys.rows()).items()],
                               orient="row", schema={"user_id": pl.String, "session_id": pl.String,
                                                     "_ts": made.schema["ts"]})
        out = (fresh.join(kept, on=["user_id", "session_id"], how="left")
               .join(settled, on=["user_id", "session_id"], how="left")
               .with_columns(pl.col("observed").fill_null(False), ts=pl.coalesce("_ts", "ts"))
               .select(made.columns))
        if out.height:
            store.upsert("sessions", out.to_dicts())
    return out.height


def unfinished_forgets(store: Store) -> list[dict[str, Any]]:
    """{id, users, status} of forget runs not `completed` (none while no forget died or runs now)."""
    rows = forget_runs(store, ("started", "purging"), columns=["id", "users", "status"])
    return sorted(({k: r[k] for k in ("id", "status")} | {"users": r["users"] or []} for r in rows),
                  key=lambda r: r["id"])


def dangling_pointers(store: Store) -> dict[str, list[dict[str, Any]]]:
    """{table: [{id, user_id, names}]}: fragments and insights whose validity pointers name a row
    stored nowhere (no turn, fragment or insight of their user: a forget killed after deleting the
    messages and finished by an older mnemo), which keep a current value closed."""
    pointers = [p for p, _ in POINTERS]
    out: dict[str, list[dict[str, Any]]] = {}
    for name in ("fragments", "insights"):
        if not store.has_table(name):
            continue
        rows = [r for r in store.read(name, columns=["id", "user_id", *pointers]).to_pylist()
                if any(r[p] for p in pointers)]
        gone = unstored(store, {r["user_id"] for r in rows}, {r[p] for r in rows for p in pointers if r[p]})
        bad = [{"id": r["id"], "user_id": r["user_id"], "names": [r[p] for p in pointers if r[p] in gone]}
               for r in rows]
        if found := [b for b in bad if b["names"]]:
            out[name] = found
    return out


def clear_dangling(store: Store, found: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Reset the dangling pointers `dangling_pointers` found (the value they closed is current again,
    as a forget leaves it: `pointers.clear_pointers`), under the writer lease; returns those it cleared
    (as `found`). What is still stored nowhere is read again under the lease: the check held none, and
    a forget it overlapped may have re-derived the rows since (clearing then would reopen a replaced
    value; such a pointer is no longer dangling and is left out)."""
    cleared: dict[str, list[dict[str, Any]]] = {}
    for name, bad in found.items():
        with store.write_lease():
            gone = unstored(store, {b["user_id"] for b in bad}, {n for b in bad for n in b["names"]})
            if still := [{**b, "names": [n for n in b["names"] if n in gone]} for b in bad if gone & set(b["names"])]:
                store.upsert(name, clear_pointers(store.read_ids(name, [b["id"] for b in still]), gone))
                cleared[name] = still
    return cleared


@dataclass
class DoctorReport:
    """What `check` found (and removed, with `fix`)."""

    duplicates: dict[str, dict[str, int]] = field(default_factory=dict)
    missing: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    removed: dict[str, int] = field(default_factory=dict)
    unstored: dict[str, int] = field(default_factory=dict)      # rows without stored BM25 terms
    terms_stored: dict[str, int] = field(default_factory=dict)  # of those, rewritten with them (fix)
    compacted: list[str] = field(default_factory=list)          # tables the fix rewrote, then compacted
    sessions: list[dict[str, Any]] = field(default_factory=list)  # session rows disagreeing with messages
    sessions_remade: int = 0
    forgets: list[dict[str, Any]] = field(default_factory=list)   # forget runs left unfinished
    dangling: dict[str, list[dict[str, Any]]] = field(default_factory=dict)   # pointers to rows stored nowhere
    pointers_cleared: int = 0

    @property
    def ok(self) -> bool:
        """No duplicates left (none found, or all removed), no missing sources, and every session row
        agreeing with its messages (or remade)."""
        return (not self.duplicates or self.removed_all()) and not self.missing \
            and self.sessions_remade == len(self.sessions) and not self.forgets \
            and self.pointers_cleared == sum(len(v) for v in self.dangling.values())

    def removed_all(self) -> bool:
        return all(self.removed.get(t, 0) == sum(n - 1 for n in d.values()) for t, d in self.duplicates.items())

    def lines(self, examples: int = 3) -> list[str]:
        """A human-readable report, a few example ids per problem."""
        out = []
        for name, dups in self.duplicates.items():
            extra = sum(n - 1 for n in dups.values())
            fixed = f"; removed {self.removed[name]}" if name in self.removed else ""
            out.append(f"{name}: {len(dups)} duplicate ids ({extra} extra rows, e.g. "
                       f"{', '.join(list(dups)[:examples])}){fixed}")
        for name, rows in self.missing.items():
            sample = "; ".join(f"{r['id']} ({r['user_id']}: {', '.join(r['missing'][:examples])})"
                               for r in rows[:examples])
            out.append(f"{name}: {len(rows)} rows with missing source messages, e.g. {sample}")
        if self.sessions:
            sample = "; ".join(f"{r['user_id']}/{r['session_id']} ({r['stored']} stored, row "
                               f"{'missing' if r['row'] is None else r['row']})" for r in self.sessions[:examples])
            done = f"; remade {self.sessions_remade}" if self.sessions_remade else \
                " (their turns are never consolidated; `mnemo doctor --fix` remakes the rows)"
            out.append(f"sessions: {len(self.sessions)} rows disagree with their messages, e.g. {sample}{done}")
        for r in self.forgets:
            users = ",".join(r["users"]) or "USER"
            out.append(f"forget {r['id']} of {', '.join(r['users'])} is {r['status']}: unless it runs now, the "
                       f"forgotten text may still be on disk; `mnemo consolidate --users {users}` finishes it "
                       "first thing (not `mnemo forget USER` alone: that forgets the whole user)")
        for name, bad in self.dangling.items():
            sample = "; ".join(f"{b['id']} ({b['user_id']}: {', '.join(b['names'])})" for b in bad[:examples])
            done = f"; cleared {self.pointers_cleared}" if self.pointers_cleared else \
                " (they keep a value closed; `mnemo doctor --fix` clears them)"
            out.append(f"{name}: {len(bad)} rows whose validity names a row stored nowhere, e.g. {sample}{done}")
        if not out:
            out.append("no duplicate ids, no missing sources, session rows agree with their messages")
        for name, n in self.unstored.items():
            done = f"; stored them for {self.terms_stored[name]}" if name in self.terms_stored else \
                " (a user's first query tokenizes them; `mnemo doctor --fix` stores them)"
            out.append(f"{name}: {n} rows without stored BM25 terms{done}")
        if self.compacted:
            out.append(f"compacted {', '.join(self.compacted)}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"duplicates": self.duplicates, "missing_sources": self.missing, "removed": self.removed,
                "unstored_terms": self.unstored, "terms_stored": self.terms_stored, "compacted": self.compacted,
                "sessions": self.sessions, "sessions_remade": self.sessions_remade,
                "unfinished_forgets": self.forgets, "dangling_pointers": self.dangling,
                "pointers_cleared": self.pointers_cleared, "ok": self.ok}


def check(store: Store, *, fix: bool = False, cleanup_older_than_s: float | None = None) -> DoctorReport:
    """Every check on the store; with `fix`, duplicates removed and missing BM25 terms stored (missing
    sources are only reported), then the tables it rewrote compacted (a rewrite leaves deletion files
    and new fragments that every read pays for), deleting versions older than `cleanup_older_than_s`.
    Rows without stored terms are not a problem (`ok`): they are slower."""
    report = DoctorReport(duplicates=duplicate_ids(store), missing=missing_sources(store),
                          unstored=unstored_terms(store), sessions=session_mismatches(store),
                          forgets=unfinished_forgets(store), dangling=dangling_pointers(store))
    if fix and report.dangling:
        report.dangling = clear_dangling(store, report.dangling)   # what a forget re-derived meanwhile is fine
        report.pointers_cleared = sum(len(v) for v in report.dangling.values())
    if fix and report.sessions:
        report.sessions_remade = remake_sessions(store, report.sessions)
    if fix and report.duplicates:
        report.removed = remove_duplicates(store, list(report.duplicates))
    if fix and report.unstored:
        report.terms_stored = store_terms(store, list(report.unstored))
    if changed := sorted({t for t, n in report.removed.items() if n} | set(report.terms_stored)
                         | (set(report.dangling) if report.pointers_cleared else set())
                         | ({"sessions"} if report.sessions_remade else set())):
        report.compacted = store.optimize(changed, cleanup_older_than_s=cleanup_older_than_s)
    return report
