"""Citation feedback (RMM §6.2): what the answering LLM was shown for a query and what it cited.

The one online write of the retriever. A record is scoped to its user and validated before it is
stored: the query is not blank, `shown_ids` are distinct ids of memories retrievable for that user
(any searchable kind), `cited_ids` ⊆ `shown_ids`, `reranker_version` (if any) is a version number
(0 to 2**63 - 1, the store's int64), and the shown ids are still stored when the record is written
(under the write lease, which a forget holds while it deletes). Writes go through one lock per process (one
writer per table); the id is a hash of (user, query, shown, cited), so a retried POST is stored
once. The nightly `train` task (`retrieval.rerank.train`) reads the records newer than the last
reranker version.
"""
from __future__ import annotations

import threading
from datetime import datetime, timezone
from typing import Any, Callable, Collection, Sequence

import numpy as np
import pyarrow as pa
from lancedb.expr import col

from memory.errors import ConfigError
from memory.ids import make_id, validate_user_id
from memory.schemas import MEMORY_TABLES
from memory.store import Store

MAX_SHOWN = 200
#: reranker versions are stored as signed 64-bit integers
MAX_RERANKER_VERSION = 2**63 - 1


class InvalidFeedbackError(ConfigError):
    """A feedback record that does not describe a retrieval of this user (HTTP 422)."""

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message, **context)


def validate(user_id: str, query: str, shown_ids: Sequence[str], cited_ids: Sequence[str],
             known_ids: Collection[str], max_query_chars: int = 4000) -> tuple[str, list[str], list[str]]:
    """The checked (user, shown, cited); raises InvalidFeedbackError with the offending ids."""
    user_id = validate_user_id(user_id)
    if not isinstance(query, str) or not query.strip():
        raise InvalidFeedbackError("feedback needs the query (it is blank)", user_id=user_id)
    if len(query) > max_query_chars:
        raise InvalidFeedbackError(f"query longer than {max_query_chars} characters", user_id=user_id)
    shown, cited = list(shown_ids or []), list(cited_ids or [])
    if not all(isinstance(s, str) for s in shown + cited):
        raise InvalidFeedbackError("memory ids must be strings", user_id=user_id)
    if not shown:
        raise InvalidFeedbackError("shown_ids is empty", user_id=user_id)
    if len(shown) > MAX_SHOWN:
        raise InvalidFeedbackError(f"more than {MAX_SHOWN} shown ids", user_id=user_id)
    if len(set(shown)) != len(shown):
        raise InvalidFeedbackError("shown_ids repeat an id", user_id=user_id)
    if len(set(cited)) != len(cited):
        raise InvalidFeedbackError("cited_ids repeat an id", user_id=user_id)
    outside = [c for c in cited if c not in set(shown)]
    if outside:
        raise InvalidFeedbackError(f"cited ids that were not shown: {outside[:5]}", user_id=user_id,
                                   ids=outside[:20])
    unknown = [s for s in shown if s not in known_ids]
    if unknown:
        raise InvalidFeedbackError(f"ids not retrievable for user {user_id}: {unknown[:5]}", user_id=user_id,
                                   ids=unknown[:20])
    return user_id, shown, cited


def stored_ids(store: Store, user_id: str, ids: Sequence[str]) -> set[str]:
    """Those of `ids` that a memory table (any searchable kind) holds for the user."""
    found: set[str] = set()
    for table in MEMORY_TABLES.values():
        if store.has_table(table):
            t = store.read(table, user_id, columns=["id"], where=col("id").isin(list(ids)))
            found.update(t.column("id").to_pylist())
    return found


def feedback_id(user_id: str, query: str, shown: Sequence[str], cited: Sequence[str]) -> str:
    return make_id("feedback", user_id, query, "|".join(shown), "|".join(cited))


class FeedbackLog:
    """Validated, user-scoped writes of feedback records to the store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()

    def record(self, user_id: str, query: str, shown_ids: Sequence[str], cited_ids: Sequence[str], *,
               known_ids: Collection[str], embed: Callable[[str], np.ndarray] | None = None,
               reranker_version: int | None = None, max_query_chars: int = 4000) -> dict[str, Any]:
        """Validate, then write one record; `embed` (query -> vector) runs only for a valid record."""
        user_id, shown, cited = validate(user_id, query, shown_ids, cited_ids, known_ids, max_query_chars)
        if reranker_version is not None and (isinstance(reranker_version, bool) or not isinstance(
                reranker_version, int) or not 0 <= reranker_version <= MAX_RERANKER_VERSION):
            raise InvalidFeedbackError(f"reranker_version must be an integer from 0 to {MAX_RERANKER_VERSION}",
                                       user_id=user_id)
        fid = feedback_id(user_id, query, shown, cited)
        row = {"id": fid, "user_id": user_id, "query": query,
               "query_vector": None if embed is None else np.asarray(embed(query), dtype=np.float32),
               "shown_ids": shown, "cited_ids": cited, "reranker_version": reranker_version,
               "created_at": datetime.now(timezone.utc)}
        with self._lock, self.store.write_lease():
            # checked again under the lease a forget writes under: `known_ids` come from a cached index,
            # and a record naming memories a forget in another process deleted meanwhile would outlive it
            gone = sorted(set(shown) - stored_ids(self.store, user_id, shown))
            if gone:
                raise InvalidFeedbackError(f"ids no longer stored for user {user_id} (forgotten since they "
                                           f"were shown?): {gone[:5]}", user_id=user_id, ids=gone[:20])
            # a retried record is kept as first written: its created_at is what training reads as new
            self.store.insert_absent("feedback", [row])
        return {"id": fid, "user_id": user_id, "shown": len(shown), "cited": len(cited)}


def read_feedback(store: Store, user_id: str | None = None, *, columns: list[str] | None = None) -> pa.Table:
    """Feedback rows of one user (or all users), oldest first."""
    t = store.read("feedback", user_id, columns=columns)
    if "created_at" in t.column_names and t.num_rows:
        t = t.sort_by([("created_at", "ascending"), ("id", "ascending")])
    return t
