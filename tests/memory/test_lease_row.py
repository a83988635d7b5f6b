"""Lease rows (`memory.lease_row`, the backend for object-store URIs) tried on a local directory
with real processes (`lease_backend="row"`): two writers upserting the same 500 new ids at one
instant leave no duplicate in 20 trials, a live holder keeps its lease past its TTL by renewing it,
and a holder killed with `kill -9` is taken over within the TTL."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from memory.doctor import check
from memory.errors import ConfigError, StoreBusyError
from memory.lease import backend_for, lease
from memory.lease_row import RowLease
from memory.store import Store
from tests.memory.test_lease import holder, race  # noqa: F401  (`holder` is a fixture)

TRIALS = 20


def test_auto_picks_a_lease_row_for_object_stores(tmp_path: Path) -> None:
    assert backend_for("s3://bucket/store") == "row" and backend_for("gs://b/s", "auto") == "row"
    assert backend_for(str(tmp_path)) == "file" and backend_for("memory://x") == "file"
    assert backend_for(str(tmp_path), "row") == "row"
    assert isinstance(lease(str(tmp_path), "write", "row"), RowLease)
    with pytest.raises(ConfigError, match="unknown lease backend"):
        backend_for(str(tmp_path), "zookeeper")


def test_two_processes_with_lease_rows_leave_no_duplicate(tmp_path: Path) -> None:
    start = time.perf_counter()
    dups = race(tmp_path, TRIALS, lease_on=True, backend="row")
    print(f"\nlease rows: {TRIALS} two-process trials of 500 new ids in {time.perf_counter() - start:.1f}s, "
          f"duplicates per trial {dups}")
    assert dups == [0] * TRIALS
    for t in range(TRIALS):
        assert check(Store(str(tmp_path / f"trial-{t}"), dim=384)).duplicates == {}


def test_a_live_holder_keeps_its_lease_past_the_ttl(tmp_path: Path, holder: Any) -> None:
    uri = str(tmp_path / "store")
    proc = holder(uri, "write", 6.0, "row", 1.0)      # renews every 1/3 s
    store = Store(uri, dim=384, write_lease_wait_s=2.5, lease_backend="row", lease_ttl_s=1.0)
    with pytest.raises(StoreBusyError, match=f"pid {proc.pid}"):
        store.upsert("runs", [{"id": "r1", "kind": "test"}])
    proc.wait(timeout=30)                              # it lets go: the next write goes in at once
    store.upsert("runs", [{"id": "r1", "kind": "test"}])
    assert store.read("runs", columns=["id"]).num_rows == 1


@pytest.mark.parametrize("ttl_s", [2.0])
def test_a_killed_holders_lease_row_is_taken_over_within_the_ttl(tmp_path: Path, holder: Any, ttl_s: float) -> None:
    uri = str(tmp_path / "store")
    proc = holder(uri, "write", 120, "row", ttl_s)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    killed = time.perf_counter()
    store = Store(uri, dim=384, write_lease_wait_s=3 * ttl_s, lease_backend="row", lease_ttl_s=ttl_s)
    store.upsert("runs", [{"id": "after", "kind": "test"}])
    taken = time.perf_counter() - killed
    print(f"\nlease row of a holder killed with kill -9 taken over {taken:.2f}s later (TTL {ttl_s:g}s)")
    assert taken < ttl_s + 1.0
    assert store.read("runs", columns=["id"]).num_rows == 1
    assert check(store).ok
