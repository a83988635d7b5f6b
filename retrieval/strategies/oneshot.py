"""One-shot strategies: a single top-K over cosine scores (RF-Mem's familiarity path, Algorithm 2),
optionally fused with BM25 and kind weights and deduplicated by source."""
from __future__ import annotations

import numpy as np

from retrieval import rfmem
from retrieval.strategies.common import Query, Result, subset, top


def one_shot(q: Query, kinds: tuple[str, ...] | None, fused: bool) -> Result:
    """Top-K of the searched rows (or of `kinds`) by cosine, plus the prior when `fused`."""
    rows, z = subset(q, kinds)
    if rows.size == 0:
        return rows, np.zeros(0, np.float32), rfmem.FAMILIARITY
    scores = z @ q.vector
    if fused:
        scores = scores + q.prior(rows, scores)
    return top(q, rows, scores, rfmem.FAMILIARITY, fused and q.settings.dedupe_sources)


def dense(q: Query) -> Result:
    """The baseline: top-K cosine over raw turns (kind "message") only; nothing when the query's
    kinds leave turns out (as any strategy returns nothing of a kind not searched)."""
    if "message" not in q.kinds:
        return np.zeros(0, np.int64), np.zeros(0, np.float32), rfmem.FAMILIARITY
    return one_shot(q, ("message",), fused=False)


def familiarity(q: Query) -> Result:
    """RF-Mem Algorithm 2: top-K cosine over every searched kind."""
    return one_shot(q, None, fused=False)


def hybrid(q: Query) -> Result:
    """Familiarity over dense + BM25 fused scores with kind weights, deduplicated by source."""
    return one_shot(q, None, fused=True)
