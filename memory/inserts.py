"""Which table versions were plain inserts of which users' rows, remembered per `Store` handle.

A reader that cached one user's rows at version `old` can keep them at `new` when every version in
between only added other users' rows (`InsertLog.inserted_only`): the retrieval cache then skips
re-reading that user's row addresses after another user's append. Versions are noted by the store's
own `insert`, or passed on by a writer in another process (`memory.ingest.append_worker`).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Iterable

__all__ = ["InsertLog", "INSERTS_KEPT"]

#: noted versions kept per store (the oldest are forgotten first)
INSERTS_KEPT = 4096


class InsertLog:
    """(table, version) -> the users whose rows it added to the version just before; thread-safe."""

    def __init__(self, kept: int = INSERTS_KEPT) -> None:
        self._kept = kept
        self._lock = threading.Lock()
        self._inserts: OrderedDict[tuple[str, int], frozenset[str]] = OrderedDict()

    def note(self, name: str, before: int, after: int, users: Iterable[str]) -> None:
        """Remember that version `after` of `name` is version `before` plus rows of `users` only;
        ignored unless `after` is the very next version (one commit, nothing else in between)."""
        if after != before + 1:
            return
        with self._lock:
            self._inserts[(name, after)] = frozenset(str(u) for u in users)
            while len(self._inserts) > self._kept:
                self._inserts.popitem(last=False)

    def last(self, name: str) -> tuple[int, int, frozenset[str]] | None:
        """The newest noted insert of `name`: (version before, its version, users); None if none."""
        with self._lock:
            for (table, after), users in reversed(self._inserts.items()):
                if table == name:
                    return after - 1, after, users
        return None

    def inserted_only(self, name: str, old: int, new: int, user_id: str) -> bool:
        """Whether every version of `name` after `old` up to `new` was a noted insert of other users'
        rows (then `user_id`'s rows sit where they sat at `old`; False: unknown, read them)."""
        with self._lock:
            version = new
            while version > old:
                users = self._inserts.get((name, version))
                if users is None or user_id in users:
                    return False
                version -= 1
        return version == old

    def forget(self, name: str) -> None:
        """Drop what is noted of `name` (the table was dropped: its versions start again)."""
        with self._lock:
            for key in [k for k in self._inserts if k[0] == name]:
                del self._inserts[key]
