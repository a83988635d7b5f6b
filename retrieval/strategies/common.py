"""What every strategy shares: the `Query` it gets, the row subsets and rankings it cuts, source
deduplication, RF-Mem's familiarity signal and gate thresholds, and where the user's profile sits.

A strategy is `Callable[[Query], Result]`: it returns ranked index rows, their scores and the route
taken (`rfmem.FAMILIARITY` / `rfmem.RECOLLECTION`), and records what it measured in `Query.signals`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from memory.read import PROFILE_KEY
from memory.settings import RetrievalSettings
from retrieval import rfmem
from retrieval.calibration import calibrate
from retrieval.index import UserIndex
from retrieval.lexical import normalized


@dataclass
class Query:
    """One retrieval as a strategy sees it: the user index, the query vector and text, k, the
    settings and the searched kinds; the strategy records what it measured in `signals`."""

    index: UserIndex
    vector: np.ndarray
    text: str | None
    k: int
    settings: RetrievalSettings
    kinds: tuple[str, ...]
    signals: dict[str, Any] = field(default_factory=dict)
    #: set by `novel`: the ranking skipped memories adding no new source, and a reranker keeps that
    deduped: bool = False

    def rows(self, kinds: tuple[str, ...] | None = None) -> np.ndarray:
        """Row numbers of the searched kinds (all rows when every kind is searched)."""
        wanted = tuple(sorted(kinds or self.kinds))
        return self.index.memo("rows:" + ",".join(wanted),
                               lambda: np.flatnonzero(np.isin(self.index.kinds, wanted)))

    def prior(self, rows: np.ndarray, z_scores: np.ndarray) -> np.ndarray:
        """Kind weights plus the weighted, max-normalized BM25 score of each row."""
        s = self.settings
        weights = self.index.memo("kindw:" + repr(sorted(s.kind_weights.items())), lambda: _kind_weights(
            self.index.kinds, s.kind_weights))
        out = weights[rows].copy()
        if self.text and s.lexical_weight > 0:
            bm = self.index.lexical(s.bm25_k1, s.bm25_b).scores(self.text)[rows]
            out += s.lexical_weight * normalized(bm)
            self.signals["lexical_hits"] = int((bm > 0).sum())
        return out


#: (ranked index rows, their scores, the route taken)
Result = tuple[np.ndarray, np.ndarray, str | None]


def _kind_weights(kinds: np.ndarray, weights: dict[str, float]) -> np.ndarray:
    """The prior weight of every row from its kind, vectorized (one mask per kind)."""
    out = np.zeros(kinds.shape[0], dtype=np.float32)
    for kind, w in weights.items():
        if w:
            out[kinds == kind] = w
    return out


def subset(q: Query, kinds: tuple[str, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(index rows of the searched kinds, their vectors), the vectors cached with the index."""
    rows = q.rows(kinds)
    z = q.index.z if rows.size == q.index.size else q.index.memo(
        "z:" + ",".join(sorted(kinds or q.kinds)), lambda: np.ascontiguousarray(q.index.z[rows]))
    return rows, z


#: a deduplicating ranking looks at k × this many candidates before skipping the covered ones
DEDUPE_POOL = 4


def novel_order(sources: Sequence[list[str] | None], order: np.ndarray, k: int) -> np.ndarray:
    """The first k positions of `order` whose item cites a source no earlier kept item cites (items
    without sources are kept): `novel` for a reordered candidate list."""
    seen: set[str] = set()
    keep = []
    for i in order.tolist():
        new = set(sources[i] or []) - seen
        if new or not sources[i]:
            keep.append(i)
            seen |= new
            if len(keep) == k:
                break
    return np.asarray(keep, dtype=np.int64)


def novel(q: Query, rows: np.ndarray, scores: np.ndarray, route: str | None) -> Result:
    """Keep ranked rows that cite at least one message not cited above them, up to k: a memory
    whose every source is already covered adds no new evidence (e.g. a fragment below its turn)."""
    sources = q.index.meta.column("source_ids").take(rows).to_pylist()
    idx = novel_order(sources, np.arange(len(sources)), q.k)
    q.deduped = True
    q.signals["skipped_redundant"] = int(len(rows) - idx.size) if idx.size < q.k else 0
    return rows[idx], scores[idx], route


def top(q: Query, rows: np.ndarray, ranked: np.ndarray, route: str | None, dedupe: bool) -> Result:
    """The best k rows by `ranked`; with `dedupe` the novel ones among the best k × DEDUPE_POOL."""
    best = rfmem.top_k(ranked, q.k * DEDUPE_POOL if dedupe else q.k)
    if dedupe:
        return novel(q, rows[best], ranked[best], route)
    return rows[best], ranked[best], route


def familiarity_signal(q: Query, probe: np.ndarray) -> tuple[float, float]:
    """RF-Mem's (mean, entropy) of the probe's top `probe_k` scores, recorded in the signals."""
    s = q.settings
    best = rfmem.top_k(probe, s.probe_k)
    mean, ent = rfmem.familiarity_signal(probe[best], s.lam, s.entropy_normalized)
    q.signals.update(probe_mean=round(mean, 4), entropy=round(ent, 4))
    return mean, ent


def thresholds(q: Query, calibrated: bool) -> tuple[float, float, float]:
    """The gate's (θ_high, θ_low, τ): the settings', or calibrated on this user's memory (cached
    with the index, recorded in `signals["calibration"]`)."""
    s = q.settings
    if not calibrated:
        return s.theta_high, s.theta_low, s.tau
    rows, z = subset(q)
    cal = q.index.memo(f"calib:{','.join(sorted(q.kinds))}:{s.probe_k}:{s.lam}:{s.entropy_normalized}",
                       lambda: calibrate(z, s))
    q.signals["calibration"] = cal
    return cal["theta_high"], cal["theta_low"], cal["tau"]


def profile_row(index: UserIndex) -> int | None:
    """Row of the user's MemWeaver profile in the index, if it has one."""
    summary = np.flatnonzero(index.kinds == "summary")
    if summary.size == 0:
        return None
    keys = index.meta.column("key").take(pa.array(summary)).to_pylist()
    hits = [int(row) for row, key in zip(summary, keys) if key == PROFILE_KEY]
    return hits[0] if hits else None
