"""Leases that span hosts: a row with an expiry in the store's own `leases` table, written through
Lance's conditional commit.

The `leases` table declares `id` Lance's unenforced primary key (`memory.schemas.leases`). Taking a
lease is one `merge_insert` on `id`: insert the row when the key is absent, or take it over when the
row there has expired (`target.expires_at < now`). Lance commits optimistically: of two writers that
race for one key (two inserts of the new key, two takeovers of the same expired row) one commits;
the other's commit conflicts, is re-planned against the new row, and then inserts or updates
nothing (measured here: one winner in each of 20 two-process trials). A writer owns the lease when
its `merge_insert` wrote the row (`num_inserted_rows + num_updated_rows == 1`).

Guarantees, and what they rest on:

- mutual exclusion while the holder renews: a holder renews its row every `ttl_s / 3` from a
  background thread (a conditional update `where holder = me`); a holder that cannot renew stops
  counting itself the holder at its own expiry (`valid()`), and `memory.store.Store` refuses to
  write on a lease that is no longer valid.
- a dead holder (`kill -9`, a lost host) blocks others for at most `ttl_s` (plus one poll).
- it needs an object store whose Lance commits are atomic (local and POSIX directories, S3 with
  conditional PUT, GCS, Azure; `s3+ddb://` elsewhere) and host clocks that agree to well under
  `ttl_s` (NTP): expiry is compared against the taker's clock.
- every take, renewal and release is one LanceDB commit (tens of ms on an object store): leases are
  for writes and runs, never for readers.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import lancedb
import pyarrow as pa

from memory import schemas
from memory.errors import StoreError
from memory.lease_reentrant import ReentrantLease

log = logging.getLogger(__name__)

TABLE = "leases"
#: default lease lifetime (`Settings.lease_ttl_s`)
LEASE_TTL_S = 30.0
#: longest pause between two tries of a held lease
_MAX_POLL_S = 0.25
#: tries to open (or create) the lease table
_OPEN_TRIES = 10


def _sql_ts(when: datetime) -> str:
    return "timestamp '" + when.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f") + "'"


class RowLease(ReentrantLease):
    """A lease row of one kind ("write", "run") in the store at `uri`; re-entrant in the holding
    thread, exclusive between threads, processes and hosts (see the module doc)."""

    def __init__(self, uri: str, kind: str, ttl_s: float = LEASE_TTL_S) -> None:
        super().__init__()
        self.uri, self.kind, self.ttl_s = uri, kind, float(ttl_s)
        self.path = None
        self._token: str | None = None
        self._valid_until = 0.0            # monotonic time after which this holder stops trusting its row
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._tbl: Any = None

    # -- the table -------------------------------------------------------------------------
    def _table(self) -> Any:
        if self._tbl is None:
            db = lancedb.connect(self.uri, read_consistency_interval=timedelta(0))
            for attempt in range(_OPEN_TRIES):   # several processes may create it at the same instant
                try:
                    try:
                        self._tbl = db.open_table(TABLE)
                    except ValueError:          # not there yet
                        self._tbl = db.create_table(TABLE, schema=schemas.schema_for(TABLE, 0), exist_ok=True)
                    break
                except Exception as exc:
                    if attempt == _OPEN_TRIES - 1:
                        raise StoreError(f"cannot open the lease table of store {self.uri}: {exc}",
                                         uri=self.uri) from exc
                    time.sleep(0.05 * (attempt + 1))
        return self._tbl

    def _row(self, token: str, now: datetime) -> pa.Table:
        return pa.Table.from_pylist([{"id": self.kind, "holder": token, "host": socket.gethostname(),
                                      "pid": os.getpid(), "acquired_at": now,
                                      "expires_at": now + timedelta(seconds=self.ttl_s)}],
                                    schema=schemas.schema_for(TABLE, 0))

    def _current(self) -> dict[str, Any] | None:
        rows = self._table().search().where(f"id = '{self.kind}'").limit(1).to_list()
        return rows[0] if rows else None

    def _take(self, token: str) -> bool:
        """One conditional commit: insert when absent, or take over when expired (a held row is only
        read: a merge_insert that writes nothing still makes a table version)."""
        now = datetime.now(timezone.utc)
        row = self._current()
        if row is not None and row["expires_at"] > now:
            return False
        started = time.monotonic()
        res = (self._table().merge_insert("id")
               .when_matched_update_all(where=f"target.expires_at < {_sql_ts(now)}")
               .when_not_matched_insert_all().execute(self._row(token, now)))
        if res.num_inserted_rows + res.num_updated_rows == 1:
            self._valid_until = started + self.ttl_s
            return True
        return False

    def _take_or_retry(self, token: str) -> bool:
        try:
            return self._take(token)
        except StoreError:
            raise
        except Exception as exc:   # commit conflicts past LanceDB's own retries: another try later
            log.debug("taking the %s lease of %s: %s", self.kind, self.uri, exc)
            return False

    def _renew(self) -> bool:
        token = self._token
        if token is None:
            return False
        now = datetime.now(timezone.utc)
        started = time.monotonic()
        res = (self._table().merge_insert("id").when_matched_update_all(where=f"target.holder = '{token}'")
               .execute(self._row(token, now)))
        if res.num_updated_rows == 1:
            self._valid_until = started + self.ttl_s
            return True
        return False

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                ok = self._renew()
            except Exception as exc:   # a transient store error: try again at the next beat
                log.warning("renewing the %s lease of %s failed: %s", self.kind, self.uri, exc)
                continue
            if not ok:
                log.error("the %s lease of %s was taken over: this holder stops writing", self.kind, self.uri)
                self._valid_until = 0.0
                return

    # -- the Lease interface ------------------------------------------------------------------
    def take_first(self, deadline: float) -> bool:
        """Take the row by `deadline` (retried with backoff), then keep it renewed in a thread."""
        token = uuid.uuid4().hex
        pause = 0.02
        while not self._take_or_retry(token):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2, _MAX_POLL_S)
        self._token = token
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew_loop, daemon=True, name=f"mnemo-lease-{self.kind}")
        self._renewer.start()
        return True

    def release_last(self) -> None:
        """Stop renewing and delete the row (when it is still ours)."""
        token, self._token = self._token, None
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        self._valid_until = 0.0
        try:
            self._table().delete(f"id = '{self.kind}' AND holder = '{token}'")
        except Exception as exc:   # the row then expires on its own
            log.warning("releasing the %s lease of %s failed: %s", self.kind, self.uri, exc)

    def where(self) -> dict[str, Any]:
        return {"uri": self.uri}

    def valid(self) -> bool:
        """Whether this holder's row is still surely its own (renewed within `ttl_s`)."""
        return self._depth > 0 and time.monotonic() < self._valid_until

    def holder(self) -> str:
        """Who holds the lease, as `pid P on HOST since T until E` ("" when free or unknown)."""
        try:
            r = self._current()
        except Exception:
            return ""
        if r is None:
            return ""
        return (f"pid {r['pid']} on {r['host']} since {r['acquired_at']:%Y-%m-%dT%H:%M:%S} "
                f"until {r['expires_at']:%Y-%m-%dT%H:%M:%S}")

    def reset_after_fork(self) -> None:
        """In a forked child: the parent's hold is not the child's."""
        super().reset_after_fork()
        self._token = None
        self._renewer = None
        self._tbl = None
