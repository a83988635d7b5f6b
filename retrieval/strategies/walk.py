"""The walk strategies: MemWeaver's random walk (`retrieval.walk`) alone (`walk`, `hybrid-walk`) and
as RF-Mem's recollection route (`rfmem-walk`, `rfmem-hybrid-walk`).

The walks start from the best-ranked graph nodes: of the cosine ranking for `walk`, of the hybrid
one (dense + BM25 + kind weights) for `hybrid-walk`. **Merge** (`MERGE`): every row keeps its
starting score; the raw messages (kind "message") cited in the `source_ids` of each walked non-seed
node gain `bonus` = 0.1 × its visits / the most visits of any such node. Recall is counted over
source message ids, and a raw turn spends one id of the K-id budget where a topic or insight spends
several. The result is deduplicated like the hybrid strategies (a memory whose every source is
already cited above it is skipped), because a boosted turn often repeats a fragment ranked above it.
Users without a graph get RF-Mem's recollection (`gated`).
"""
from __future__ import annotations

from typing import TypedDict

import numpy as np

from retrieval import rfmem
from retrieval.strategies.common import (DEDUPE_POOL, Query, Result, familiarity_signal, novel, subset,
                                         thresholds, top)
from retrieval.strategies.gated import gated
from retrieval.walk import graph_for, walk_from_scores

#: how walked nodes join the ranking (see `expand`). `by`: the gain of a walked node, "walked" (non-seed
#: nodes: their visits / the most visits of any of them), "visits" (the same, seeds included) or
#: "reach" (non-seed nodes: their best Eq. 2 score S(u→v) / the best of any node); `bonus`: what the
#: top node's targets gain; the targets are the raw messages a walked node cites (`cite`) and/or the
#: node itself (`own`). Chosen on the LoCoMo dev split (bench/RESULTS.md).
class Merge(TypedDict):
    by: str
    bonus: float
    cite: bool
    own: bool


MERGE: Merge = {"by": "walked", "bonus": 0.1, "cite": True, "own": False}
#: how many of the walk's unique visited nodes, most visited first, `signals["walk_nodes"]` lists by id
WALK_NODES_SHOWN = 50


def expand(q: Query, rows: np.ndarray, ranked: np.ndarray, *, by: str, bonus: float, cite: bool, own: bool
           ) -> tuple[np.ndarray, np.ndarray] | None:
    """The walk as a recollection expansion: (index rows, scores) best first, or None without a graph.

    Walks start from the graph nodes best by `ranked` (the score of each row of `rows`, index rows in
    ascending order as `Query.rows` gives them). Every row keeps its `ranked` score; the targets of
    a walked node (with `cite` the raw messages it cites, with `own` the node's own row) gain
    `bonus` × its gain (see `MERGE`), a row reached through several nodes the largest of theirs. So
    the turns next to the top hits in their conversation, which the walks reach along temporal
    edges, climb over weaker one-off hits.
    """
    index = q.index
    graph = graph_for(index)
    if graph is None or graph.size == 0:
        return None
    full = np.full(index.size, -np.inf, dtype=np.float64)
    full[rows] = ranked
    walked = walk_from_scores(index, graph, q.vector, full, text=q.text)
    visited = [int(graph.rows[n]) for n in walked.ranked()[:WALK_NODES_SHOWN]]
    q.signals.update(walk_steps=walked.steps, walk_visited=len(walked.nodes),
                     walk_nodes=index.meta.column("id").take(visited).to_pylist() if visited else [])
    score = np.asarray(ranked, dtype=np.float64).copy()
    if by == "visits":
        gain: dict[int, float] = {n: float(c) for n, c in walked.visits.items()}
    elif by == "walked":
        seeds = set(walked.seeds)
        gain = {n: float(c) for n, c in walked.visits.items() if n not in seeds}
    else:
        gain = walked.reach
    most = max(gain.values(), default=1.0) or 1.0
    add: dict[int, float] = {}
    for node, g in gain.items():
        targets = graph.cites[node].tolist() if cite else []
        if own:
            targets.append(int(graph.rows[node]))
        if not targets:
            continue
        at = np.searchsorted(rows, targets)         # `rows` ascend (Query.rows); unsearched targets miss
        for r, i in zip(targets, at.tolist()):
            if i < rows.size and int(rows[i]) == r:
                add[i] = max(add.get(i, 0.0), bonus * g / most)
    for i, x in add.items():
        score[i] += x
    q.signals["walk_boosted"] = len(add)
    order = rfmem.top_k(score, q.k * DEDUPE_POOL)
    return rows[order], score[order].astype(np.float32)


def walk_strategy(q: Query, *, gate: bool, fused: bool) -> Result:
    """`walk` / `hybrid-walk` (always walk, from the cosine or the fused ranking), `rfmem-walk` /
    `rfmem-hybrid-walk` (RF-Mem's gate; its recollection route is the walk instead of Algorithm 3).
    Users without a graph get RF-Mem's recollection."""
    s = q.settings
    rows, z = subset(q)
    if rows.size == 0:
        return rows, np.zeros(0, np.float32), rfmem.RECOLLECTION
    probe = z @ q.vector
    route = rfmem.RECOLLECTION
    if gate:
        mean, ent = familiarity_signal(q, probe)
        route = rfmem.gate(mean, ent, *thresholds(q, False))
    ranked = probe + q.prior(rows, probe) if fused else probe
    if route == rfmem.FAMILIARITY:
        return top(q, rows, ranked, route, fused and s.dedupe_sources)
    out = expand(q, rows, ranked, **MERGE)
    if out is None:
        return gated(q, route=rfmem.RECOLLECTION, fused=fused)
    idx, sc = out
    if s.dedupe_sources:  # as the hybrid strategies: boosted turns often repeat a fragment above them
        return novel(q, idx, sc, rfmem.RECOLLECTION)
    return idx[: q.k], sc[: q.k], rfmem.RECOLLECTION
