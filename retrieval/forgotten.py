"""Which users a forget has touched since the last look, whichever process ran it.

A forget records its run in `runs` (kind `forget`, status `started`, then `purging` / `completed`)
before and after it deletes. A long-running service holds users' indexes (their texts) in memory;
a user forgotten by another process (`mnemo forget`, a second service) must not stay there until
that user's next request, which for a deleted user never comes. `ForgetWatch.touched()` returns the
users of every (run, status) not seen before, so the cache drops them; the status counts because
a cache may reload a user between a run's `started` row and its deletes.
"""
from __future__ import annotations

import logging

from lancedb.expr import col, lit

from memory.errors import StoreError
from memory.store import Store

log = logging.getLogger(__name__)


class ForgetWatch:
    """The forget runs of one store already seen; `touched()` reports the users of new ones."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._seen: set[tuple[str, str]] | None = None   # None: not read yet (nothing to evict then)
        self._version = -1                                # of `runs` when last read

    def touched(self) -> set[str]:
        """Users of the forget runs started, or moved to another status, since the last call (none on
        the first call, which only records what exists: the cache is empty then)."""
        try:
            version = self.store.version("runs")
            if version == self._version:
                return set()
            rows = self.store.read("runs", columns=["id", "status", "users"],
                                   where=col("kind") == lit("forget"), version=version).to_pylist()
        except StoreError as exc:   # a store being made; the next check reads again
            log.warning("could not read the forget runs (%s)", exc)
            return set()
        self._version = version
        now = {(r["id"], r["status"] or "") for r in rows}
        first, new = self._seen is None, now - (self._seen or set())
        self._seen = now
        if first:
            return set()
        return {u for r in rows if (r["id"], r["status"] or "") in new for u in r["users"] or ()}
