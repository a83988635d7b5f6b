"""RF-Mem Algorithm 1 over a user index: probe, familiarity signal, gate, then the familiarity top-K
or Algorithm 3's recollection (retrieve → KMeans → α-mix, up to R rounds); `rfmem`, `recollection`,
`rfmem-hybrid` and `calibrated` are this function with a forced route, fused scores or calibrated
thresholds."""
from __future__ import annotations

import numpy as np

from retrieval import rfmem
from retrieval.strategies.common import (DEDUPE_POOL, Query, Result, familiarity_signal, novel,
                                         pool_turns, subset, thresholds, top)


def gated(q: Query, *, route: str | None, fused: bool, calibrated: bool = False) -> Result:
    """Algorithm 1 with a forced route (`route`) or the gate (route=None)."""
    s = q.settings
    rows, z = subset(q)
    if rows.size == 0:
        return rows, np.zeros(0, np.float32), route or rfmem.RECOLLECTION
    probe = z @ q.vector
    mean, ent = familiarity_signal(q, probe)
    if route is None:
        hi, lo, tau = thresholds(q, calibrated)
        route = rfmem.gate(mean, ent, hi, lo, tau)
    prior = q.prior(rows, probe) if fused else None
    ranked = probe + prior if prior is not None else probe
    dedupe = fused and s.dedupe_sources
    if route == rfmem.FAMILIARITY:
        return top(q, rows, ranked, route, dedupe)
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
    if dedupe and s.turn_pool_gamma > 0:  # pool the union's turns with their memories, rank it again
        cand, sc = pool_turns(q, rows[idx], sc)
        order = rfmem.top_k(sc, sc.size)
        return novel(q, cand[order], sc[order], route)
    if dedupe:
        return novel(q, rows[idx], sc, route)
    return rows[idx], sc, route
