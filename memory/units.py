"""Multi-table units: a writer's several writes that readers see all together or not at all.

A consolidation shard commit (or a forget) writes many tables, one LanceDB commit each. Inside
`Store.unit()` the writer holds the store's write lease for the whole unit and publishes the store's
one commit marker (the `units` table, one row) twice: `open` with every table's version before
the unit's first write, and `closed` with every version after its last. `snapshot(store, tables)`
gives a reader the versions to pin: while a unit is open, the marker's `open` versions (the store
as it was before the unit); otherwise the latest versions, re-checked against the marker so a
unit that opened while they were read is never half seen.

Plain writes (appends, feedback) publish nothing: they are visible to readers at the next
`snapshot` (no open unit can be in between, the lease excludes it). A unit whose holder died
leaves its marker open: the next write to take the lease (any write) marks it `aborted` with the
current versions, so readers move on; the half unit is then visible, as after a crash before the
watermarks, and the re-run rewrites the same deterministic rows.
"""
from __future__ import annotations

import json
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterable, Iterator

if TYPE_CHECKING:
    from memory.store import Store

#: the marker table and its one row id
UNITS = "units"
MARKER_ID = "store"
#: tables that are not data: never in a marker's versions
HIDDEN = ("units", "leases")
#: how often a reader re-reads the versions when units keep opening under it
SNAPSHOT_TRIES = 8

#: checks the latest version of a snapshot's tables in parallel (each is a small manifest read)
_VERSIONS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="mnemo-versions")
_DEPTH = threading.local()   # store key -> units open in this thread



def _depths() -> dict[str, int]:
    depths: dict[str, int] | None = getattr(_DEPTH, "depths", None)
    if depths is None:
        depths = _DEPTH.depths = {}
    return depths


def in_unit(store: "Store") -> bool:
    """Whether this thread has a unit open on the store."""
    return _depths().get(store.lease_key, 0) > 0


def table_versions(store: "Store") -> dict[str, int]:
    """The latest version of every data table of the store."""
    return _latest(store, [name for name in sorted(store.table_names()) if name not in HIDDEN])


def _latest(store: "Store", names: list[str]) -> dict[str, int]:
    """The latest version of each of `names`, checked at once (LanceDB releases the GIL)."""
    return dict(zip(names, _VERSIONS.map(store.version, names)))


#: the marker's columns a reader needs (`latest_marker`)
MARKER_COLUMNS = ("seq", "state", "label", "versions_json", "holder")


def latest_marker(store: "Store") -> dict[str, Any] | None:
    """The store's commit marker as last published (None: no unit ever). Kept per handle (`Store.marker_memo`)
    and `units` version: every write and every reader's snapshot asks, and the marker only moves with
    units, so most calls cost one version check instead of a read (the table is never dropped)."""
    version = store.version(UNITS)      # the newest, whatever the handle's consistency interval
    if version == 0:
        return None
    known = store.marker_memo           # one tuple, replaced whole: no lock needed
    if known is not None and known[0] == version:
        return dict(known[1]) if known[1] is not None else None
    rows = store.read(UNITS, columns=list(MARKER_COLUMNS), version=version).to_pylist()
    marker = max(rows, key=lambda r: r["seq"] or 0) if rows else None
    store.marker_memo = (version, marker)
    return dict(marker) if marker is not None else None


def publish(store: "Store", state: str, users: Iterable[str], label: str, seq: int) -> dict[str, Any]:
    """Write the marker (caller holds the write lease) and remember it on the handle: the lease holder
    is the only writer of `units`, so the version its write made holds this marker."""
    row = {"id": MARKER_ID, "seq": seq, "state": state, "label": label, "user_ids": sorted(set(users)),
           "versions_json": json.dumps(table_versions(store), sort_keys=True),
           "holder": f"pid {os.getpid()} on {socket.gethostname()}", "at": datetime.now(timezone.utc)}
    store.upsert(UNITS, [row])
    store.marker_memo = (store.version(UNITS), {k: row[k] for k in MARKER_COLUMNS})
    return row


def recover(store: "Store") -> None:
    """On taking the write lease (outside a unit): a marker still open belongs to a unit whose holder
    died (units hold the lease throughout); mark it aborted so readers see the writes after it."""
    if in_unit(store):
        return
    marker = latest_marker(store)
    if marker is not None and marker["state"] == "open":
        publish(store, "aborted", [], f"aborted {marker['label']} ({marker['holder']})", marker["seq"] + 1)


@contextmanager
def unit(store: "Store", user_ids: Iterable[str] = (), label: str = "unit") -> Iterator[None]:
    """Hold the write lease for a block and publish it as one unit (see the module doc); a unit
    opened inside another is part of it."""
    users = list(user_ids)
    depths = _depths()
    key = store.lease_key
    if depths.get(key, 0) > 0:
        depths[key] += 1
        try:
            yield
        finally:
            depths[key] -= 1
        return
    with store.write_lease():        # recovers a dead holder's open marker first
        marker = latest_marker(store)
        seq = (marker["seq"] if marker else 0) + 1
        publish(store, "open", users, label, seq)
        depths[key] = 1
        try:
            yield
        finally:
            depths[key] = 0
            # on an error too: what was written stays (a re-run rewrites the same rows), readers see it
            publish(store, "closed", users, label, seq + 1)


def snapshot(store: "Store", tables: Iterable[str]) -> dict[str, int]:
    """The version of each of `tables` a reader should pin: never inside a unit (see the module doc)."""
    names = list(tables)
    current: dict[str, int] = {}
    before = latest_marker(store)
    for _ in range(SNAPSHOT_TRIES):
        if before is not None and before["state"] == "open":
            versions = json.loads(before["versions_json"] or "{}")
            return {name: int(versions.get(name, 0)) for name in names}
        current = _latest(store, names)
        after = latest_marker(store)
        if (after or {}).get("seq") == (before or {}).get("seq"):
            return current
        before = after               # a unit opened or closed meanwhile: look again
    return current
