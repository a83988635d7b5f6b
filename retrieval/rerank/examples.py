"""Citation feedback as training examples for the RMM reranker: each logged query's candidate set
rebuilt with the base strategy (`candidates`), the shown items and their rewards (+1 cited, −1 shown
but not cited). The retriever is seen through the small protocol the trainer needs of it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np

from memory.settings import RetrievalSettings
from memory.store import Store
from retrieval.index import UserIndex


class RankedItem(Protocol):
    """What the trainer reads of a retrieved item (`retrieval.retriever.RetrievedItem`)."""

    @property
    def id(self) -> str: ...
    @property
    def score(self) -> float: ...
    @property
    def source_ids(self) -> list[str]: ...


class Ranking(Protocol):
    """What the trainer reads of a retrieval result (`retrieval.retriever.RetrievalResult`)."""

    @property
    def items(self) -> Sequence[RankedItem]: ...
    @property
    def deduped(self) -> bool: ...


class BaseRetriever(Protocol):
    """What the trainer needs of the retriever (`retrieval.retriever.Retriever`): the base
    strategy's ranking, the user index, the embedder, the store and the settings."""

    @property
    def store(self) -> Store: ...
    @property
    def settings(self) -> RetrievalSettings: ...

    def user_index(self, user_id: str) -> UserIndex: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...

    def retrieve(self, user_id: str, query: np.ndarray, k: int | None = None, strategy: str | None = None,
                 *, text: str | None = None, rerank: bool | None = None) -> Ranking: ...


@dataclass
class Example:
    """One logged query: candidate vectors (K, d), their prior, the shown positions and rewards."""

    q: np.ndarray
    m: np.ndarray
    prior: np.ndarray
    shown: np.ndarray
    reward: np.ndarray
    #: each candidate's source ids when the base strategy deduplicates (`Query.deduped`): a candidate
    #: whose sources the items shown before it all cite could not have been shown after them
    sources: list[list[str]] | None = None


def candidates(retriever: BaseRetriever, user_id: str, qvec: np.ndarray, text: str | None,
               top_k: int, strategy: str | None = None
               ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, list[list[str]] | None]:
    """The base strategy's top-K for a query: ids, vectors (K, d), prior (base − cosine), rows, and
    the source ids of each when the strategy deduplicates sources (else None)."""
    index = retriever.user_index(user_id)
    res = retriever.retrieve(user_id, qvec, k=min(top_k, retriever.settings.max_k), strategy=strategy,
                             text=text, rerank=False)
    pos = index.row_of_id()
    rows = np.asarray([pos[it.id] for it in res.items], dtype=np.int64)
    m = index.z[rows]
    base = np.asarray([it.score for it in res.items], dtype=np.float32)
    sources = [list(it.source_ids) for it in res.items] if res.deduped else None
    return [it.id for it in res.items], m, base - m @ qvec, rows, sources


def examples_from_feedback(retriever: BaseRetriever, rows: Sequence[dict[str, Any]], top_k: int,
                           strategy: str | None = None) -> list[Example]:
    """Rebuild each logged query's candidate set with the base strategy (shown items that fell out of
    it are appended with prior 0; ids no longer stored are dropped)."""
    out = []
    for r in rows:
        user = r["user_id"]
        qvec = r.get("query_vector")
        qvec = retriever.embed([r["query"]])[0] if qvec is None else np.asarray(qvec, dtype=np.float32)
        ids, m, prior, _, sources = candidates(retriever, user, qvec, r["query"], top_k, strategy)
        pos = {v: i for i, v in enumerate(ids)}
        extra = [s for s in r["shown_ids"] if s not in pos]
        if extra:
            index = retriever.user_index(user)
            where = index.row_of_id()
            extra = [s for s in extra if s in where]
            if extra:
                m = np.concatenate([m, index.z[[where[s] for s in extra]]])
                prior = np.concatenate([prior, np.zeros(len(extra), np.float32)])
                if sources is not None:
                    src = index.meta.column("source_ids").take([where[s] for s in extra]).to_pylist()
                    sources = sources + [list(x or []) for x in src]
                for s in extra:
                    pos[s] = len(pos)
        shown = [pos[s] for s in r["shown_ids"] if s in pos]
        if not shown:
            continue
        cited = set(r["cited_ids"] or [])
        reward = np.asarray([1.0 if s in cited else -1.0 for s in r["shown_ids"] if s in pos])
        out.append(Example(qvec, m, prior.astype(np.float32), np.asarray(shown), reward, sources))
    return out


