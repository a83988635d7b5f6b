"""Retrieval strategies by name: the RF-Mem paths as published, and the variants beyond them.

| name | what it does |
| --- | --- |
| dense | one-shot top-K cosine over raw turns only (kind=message): the baseline |
| familiarity | RF-Mem Algorithm 2: one-shot top-K cosine over every searched kind |
| recollection | RF-Mem Algorithm 3 always (retrieve → KMeans → α-mix, R rounds) |
| rfmem | RF-Mem Algorithm 1: probe, familiarity signal, gate with the paper's θ_high, θ_low, τ |
| hybrid | familiarity over dense + BM25 fused scores, with kind weights |
| rfmem-hybrid | rfmem whose both paths rank by the fused scores with kind weights |
| calibrated | rfmem-hybrid with θ_high, θ_low, τ calibrated on this user's score distribution |
| walk | MemWeaver's context-aware random walk (Eq. 2) along the user's temporal graph from the familiarity top hits; the raw turns the walked nodes cite gain a bonus |
| hybrid-walk | the same walk seeded by the hybrid (dense + BM25 + kind weights) top hits |
| rfmem-walk | rfmem whose recollection route is the walk (the paper's graph-based alternative) |
| rfmem-hybrid-walk | rfmem-hybrid whose recollection route is the walk |

Each strategy gets a `Query` (the user index, the query vector and text, k, settings) and returns
ranked row indices, their scores, the route taken and extra signals.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from retrieval import rfmem
from retrieval.index import UserIndex
from retrieval.lexical import normalized
from retrieval.settings import RetrievalSettings

log = logging.getLogger(__name__)


@dataclass
class Query:
    index: UserIndex
    vector: np.ndarray
    text: str | None
    k: int
    settings: RetrievalSettings
    kinds: tuple[str, ...]
    signals: dict[str, Any] = field(default_factory=dict)
    #: set by `_novel`: the ranking skipped memories adding no new source, and a reranker keeps that
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


Result = tuple[np.ndarray, np.ndarray, str | None]


def _kind_weights(kinds: np.ndarray, weights: dict[str, float]) -> np.ndarray:
    """The prior weight of every row from its kind, vectorized (one mask per kind)."""
    out = np.zeros(kinds.shape[0], dtype=np.float32)
    for kind, w in weights.items():
        if w:
            out[kinds == kind] = w
    return out


def _subset(q: Query, kinds: tuple[str, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    rows = q.rows(kinds)
    z = q.index.z if rows.size == q.index.size else q.index.memo(
        "z:" + ",".join(sorted(kinds or q.kinds)), lambda: np.ascontiguousarray(q.index.z[rows]))
    return rows, z


#: a deduplicating ranking looks at k × this many candidates before skipping the covered ones
DEDUPE_POOL = 4


def _novel(q: Query, rows: np.ndarray, scores: np.ndarray, route: str | None) -> Result:
    """Keep ranked rows that cite at least one message not cited above them, up to k: a memory
    whose every source is already covered adds no new evidence (e.g. a fragment below its turn)."""
    sources = q.index.meta.column("source_ids").take(rows).to_pylist()
    idx = novel_order(sources, np.arange(len(sources)), q.k)
    q.deduped = True
    q.signals["skipped_redundant"] = int(len(rows) - idx.size) if idx.size < q.k else 0
    return rows[idx], scores[idx], route


def _top(q: Query, rows: np.ndarray, ranked: np.ndarray, route: str | None, dedupe: bool) -> Result:
    """The best k rows by `ranked`; with `dedupe` the novel ones among the best k × DEDUPE_POOL."""
    top = rfmem.top_k(ranked, q.k * DEDUPE_POOL if dedupe else q.k)
    if dedupe:
        return _novel(q, rows[top], ranked[top], route)
    return rows[top], ranked[top], route


def familiarity_signal(q: Query, probe: np.ndarray) -> tuple[float, float]:
    """RF-Mem's (mean, entropy) of the probe's top `probe_k` scores, recorded in the signals."""
    s = q.settings
    top = rfmem.top_k(probe, s.probe_k)
    mean, ent = rfmem.familiarity_signal(probe[top], s.lam, s.entropy_normalized)
    q.signals.update(probe_mean=round(mean, 4), entropy=round(ent, 4))
    return mean, ent


def _one_shot(q: Query, kinds: tuple[str, ...] | None, fused: bool) -> Result:
    rows, z = _subset(q, kinds)
    if rows.size == 0:
        return rows, np.zeros(0, np.float32), rfmem.FAMILIARITY
    scores = z @ q.vector
    if fused:
        scores = scores + q.prior(rows, scores)
    return _top(q, rows, scores, rfmem.FAMILIARITY, fused and q.settings.dedupe_sources)


def dense(q: Query) -> Result:
    return _one_shot(q, ("message",), fused=False)


def familiarity(q: Query) -> Result:
    return _one_shot(q, None, fused=False)


def hybrid(q: Query) -> Result:
    return _one_shot(q, None, fused=True)


def _thresholds(q: Query, calibrated: bool) -> tuple[float, float, float]:
    s = q.settings
    if not calibrated:
        return s.theta_high, s.theta_low, s.tau
    from retrieval.calibration import calibrate

    rows, z = _subset(q)
    cal = q.index.memo(f"calib:{','.join(sorted(q.kinds))}:{s.probe_k}:{s.lam}:{s.entropy_normalized}",
                       lambda: calibrate(z, s))
    q.signals["calibration"] = cal
    return cal["theta_high"], cal["theta_low"], cal["tau"]


def _rfmem(q: Query, *, route: str | None, fused: bool, calibrated: bool = False) -> Result:
    """Algorithm 1 with a forced route (`route`) or the gate (route=None)."""
    s = q.settings
    rows, z = _subset(q)
    if rows.size == 0:
        return rows, np.zeros(0, np.float32), route or rfmem.RECOLLECTION
    probe = z @ q.vector
    mean, ent = familiarity_signal(q, probe)
    if route is None:
        hi, lo, tau = _thresholds(q, calibrated)
        route = rfmem.gate(mean, ent, hi, lo, tau)
    prior = q.prior(rows, probe) if fused else None
    ranked = probe + prior if prior is not None else probe
    dedupe = fused and s.dedupe_sources
    if route == rfmem.FAMILIARITY:
        return _top(q, rows, ranked, route, dedupe)
    rec = rfmem.recollection(q.vector, z, q.k, beam=s.beam, fanout=s.fanout, rounds=s.rounds, alpha=s.alpha,
                             prior=prior, probe_scores=probe, kmeans_iters=s.kmeans_iters,
                             early_stop=not s.full_exploration)
    q.signals.update(rounds=rec.rounds, recollect_queries=rec.queries, recollect_rows_scored=rec.exact_rows)
    idx, sc = rec.idx, rec.scores
    if s.rerank_union:  # Appendix D.9: re-rank the collected union by the original query's score
        order = rfmem.top_k(ranked[idx], q.k)
        idx, sc = idx[order], ranked[idx][order]
    want = q.k * DEDUPE_POOL if dedupe else q.k
    if idx.size < want:  # the truncated union came up short: fill from the probe ranking
        have = set(idx.tolist())
        extra = [i for i in rfmem.top_k(ranked, want + idx.size).tolist() if i not in have][: want - idx.size]
        q.signals["filled"] = len(extra)
        idx = np.concatenate([idx, np.asarray(extra, dtype=np.int64)])
        sc = np.concatenate([sc, ranked[extra].astype(np.float32)])
    if dedupe:
        return _novel(q, rows[idx], sc, route)
    return rows[idx], sc, route


STRATEGIES: dict[str, Callable[[Query], Result]] = {
    "dense": dense,
    "familiarity": familiarity,
    "recollection": lambda q: _rfmem(q, route=rfmem.RECOLLECTION, fused=False),
    "rfmem": lambda q: _rfmem(q, route=None, fused=False),
    "hybrid": hybrid,
    "rfmem-hybrid": lambda q: _rfmem(q, route=None, fused=True),
    "calibrated": lambda q: _rfmem(q, route=None, fused=True, calibrated=True),
}


def _walk(gate: bool, fused: bool) -> Callable[[Query], Result]:
    def run(q: Query) -> Result:
        from retrieval.walk import walk_strategy  # MemWeaver random walk (retrieval/walk.py)

        return walk_strategy(q, gate=gate, fused=fused)
    return run


#: MemWeaver's context-aware random walk, alone and as RF-Mem's recollection expansion
STRATEGIES.update({
    "walk": _walk(gate=False, fused=False),
    "hybrid-walk": _walk(gate=False, fused=True),
    "rfmem-walk": _walk(gate=True, fused=False),
    "rfmem-hybrid-walk": _walk(gate=True, fused=True),
})


def novel_order(sources: list[list[str] | None], order: np.ndarray, k: int) -> np.ndarray:
    """The first k positions of `order` whose item cites a source no earlier kept item cites (items
    without sources are kept): `_novel` for a reordered candidate list."""
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


def profile_row(index: UserIndex) -> int | None:
    """Row of the user's MemWeaver profile in the index, if it has one."""
    from retrieval.context import PROFILE_KEY

    summary = np.flatnonzero(index.kinds == "summary")
    if summary.size == 0:
        return None
    keys = index.meta.column("key").take(pa.array(summary)).to_pylist()
    hits = [int(row) for row, key in zip(summary, keys) if key == PROFILE_KEY]
    return hits[0] if hits else None
