"""The physical side of a forget: rewriting the data files that still hold deleted rows and removing
every older table version, so forgotten text is gone from the bytes under the store directory.

A LanceDB delete (or an upsert replacing a row) only marks the old row in a deletion file; its bytes
stay in the data file until compaction rewrites that file, and every older version keeps its files
until they are cleaned up. `optimize` compacts and cleans up, but a table made of a single data
file with under 10 % of its rows deleted is left as it is (Lance's default
`materialize_deletions_threshold`). So a touched table with one data file first gets one row
re-written (a second, small file): compaction then merges both into a new file holding only live
rows, and `cleanup_older_than=0` removes the old files. Limit: data files of over a million rows are
not compacted by default either; a table that large would need Lance's own `compact_files`
(`pylance`) with `materialize_deletions_threshold=0`.
"""
from __future__ import annotations

import json
import logging
import os
from datetime import datetime, timezone
from typing import Any, Iterable

from lancedb.expr import col, lit

from memory.lease import is_local
from memory.nightly import forget_runs
from memory.store import Store
from memory.units import HIDDEN, UNITS

log = logging.getLogger(__name__)


def unpurged(store: Store) -> list[dict[str, Any]]:
    """`runs` rows of forgets (of any user) whose deletes are written and whose purge never finished."""
    return forget_runs(store, ("purging",))


def finish_purges(store: Store) -> int:
    """Purge the tables of the forgets (of any user) a crash left `purging` and record them completed;
    how many. The caller holds the run lease (a purge compacts and deletes old files)."""
    owed = unpurged(store)
    if not owed:
        return 0
    tables: set[str] = set().union(*(json.loads(r["counts_json"] or "{}").get("purge", []) for r in owed))
    purge(store, tables | {"runs"})
    now = datetime.now(timezone.utc)
    store.upsert("runs", [{**r, "status": "completed", "finished_at": now} for r in owed])
    return len(owed)


def dir_bytes(uri: str) -> int:
    """Bytes of every file under a local store directory (0 for an object-store URI). A file or folder
    removed while it is walked (another writer's temporary file, a compaction) counts 0: a measure
    must not fail the forget it reports on."""
    if not is_local(uri):
        return 0
    total = 0
    for folder, _, files in os.walk(uri.removeprefix("file://")):     # os.walk skips folders gone meanwhile
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                pass
    return total


def purge(store: Store, touched: Iterable[str]) -> list[str]:
    """Compact the `touched` tables down to their live rows and drop every old version of every table;
    returns the tables that were compacted. Readers pinned to an older version fail afterwards (their
    files are gone): that is the point."""
    touched = set(touched)
    done = []
    for name in store.table_names():
        if name in HIDDEN and name != UNITS:   # lease rows: in use by other processes' lease attempts
            continue
        with store.write_lease():   # the nudge and the compaction: one hold
            if name in touched:
                tbl = store.table(name)
                tbl.checkout_latest()
                if tbl.count_rows() and tbl.stats()["fragment_stats"]["num_fragments"] == 1:
                    nudge(store, name)
                store.reindex_users(name)
            # every table, even an empty one (-1), and every version but the latest (0); failures raise
            store.optimize_table(name, min_fragments=-1, cleanup_older_than_s=0, delete_unverified=True)
        if name in touched:
            done.append(name)
    return done


def nudge(store: Store, name: str) -> None:
    """Re-write one row of a one-file table so that compaction has two files to merge (and so rewrites
    the first, deleted rows left out)."""
    tbl = store.table(name)
    first = tbl.search().select(["id"]).limit(1).to_arrow()
    if first.num_rows:
        row = store.read(name, where=col("id") == lit(first.column("id")[0].as_py()))
        store.upsert(name, row)
