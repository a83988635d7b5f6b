"""MemWeaver's context-aware random walk (Yu et al. §3.3.1, Eq. 2) over one user's memory graph.

From node u the walk moves to a neighbour v (a temporal neighbour; optionally any node of u's K-means
cluster, see below) with probability proportional to

    S(u→v) = cos(q, v)^α · exp(−λ1 Δt_v) · exp(−λ2 Δt_uv),     α = 1.5, λ1 = 0.01, λ2 = 0.02

(Appendix A.3), for `steps` = 10 steps. Negative cosines count as 0.

**Time unit: days.** Δt_v is the time from v's session to the query and Δt_uv the time between the
two sessions, both in days. The paper gives no unit; its histories (LaMP profiles) are dated by day
and span months to years, and days are the unit under which its λ values mean something: with λ1 =
0.01 a memory one year old keeps e^−3.65 ≈ 3 % of the weight of today's, with λ2 = 0.02 a hop across
a month keeps e^−0.6 ≈ 55 %. In hours or seconds both factors would vanish after a few days and the
walk would never leave a session; in years they would be constant. The query time is the user's
latest memory (the retriever has no clock of the question; in a live assistant the two are close).

Deterministic: the random generator is seeded by a hash of the user id and the query vector, so
the same query gives the same walk. Eq. 2 and its α, λ1, λ2 and 10 steps are the paper's; the rest
is ours, chosen on the LoCoMo dev split (bench/RESULTS.md), one setting for both extractions:

* **Seeds and walks:** `walks` = 5 walks start from each of the `seeds` = 3 best-ranked graph nodes
  (fragments and insights; raw messages and topics are not nodes): the cosine ranking for `walk`,
  the hybrid one (dense + BM25 + kind weights) for `hybrid-walk`. Before each step a walk jumps back
  to its seed with probability `restart` = 0.3, so visits concentrate around the seeds.
* **Neighbours: temporal edges only** (`WalkParams.cluster` = False). The stored K-means clusters
  (K = 5 per user) hold ~100 nodes each, so a cluster neighbourhood is "everything similar", and
  Eq. 2 over it draws destinations by cos(q, v)^1.5, i.e. re-samples the cosine ranking: with
  cluster mates the walk was within −0.011 / +0.006 R@10 of its start in every setting tried
  (seeds, walks, restart, merge, bonus 0.01-0.05). Along temporal edges (consecutive nodes: the
  next and previous memory of the conversation) Eq. 2 picks the more relevant and more recent side
  and the walk explores the turns around each top hit, which one-shot search cannot see.
* **Merge:** every row keeps its starting score; the raw messages (kind "message") cited in the
  `source_ids` of each walked non-seed node gain `bonus` = 0.1 × its visits / the most visits of any
  such node (`MERGE`): Recall is counted over source message ids, and a raw turn spends one id of
  the K-id budget where a topic or insight spends several. The result is deduplicated like the
  hybrid strategies (a memory whose every source is already cited above it is skipped), because a
  boosted turn often repeats a fragment ranked above it.

Measured (LoCoMo dev5, R@10 overall / multi-hop; rules | observations extraction): `rfmem`
0.6386 / 0.4375 | 0.6739 / 0.4643; the walk's start (cosine ranking, deduplicated, bonus 0) 0.6502 /
0.4535 | 0.6786 / 0.4751; `walk` 0.6616 / 0.4618 | 0.6825 / 0.4680 (R@5 0.5687 | 0.5865 vs start
0.5580 | 0.5777). So the walk adds +0.011 | +0.004 R@10 and +0.011 | +0.009 R@5 over its start,
+0.008 | −0.007 multi-hop (its context turns displace some cross-session evidence on observations);
the rest of the gain over `rfmem` is the deduplication. With cluster mates as neighbours too:
0.6517 / 0.4476 | 0.6818 / 0.4570; boosting the walked nodes themselves instead of their turns
0.6659 / 0.4635 | 0.6834 / 0.4491; bonus 0.05: 0.6555 / 0.4570 | 0.6838 / 0.4751; one walk per
seed without restart: 0.6575 / 0.4608 | 0.6838 / 0.4751. Not a walk-specific effect: boosting
by a flat 0.02-0.1 every item citing a turn within ±2 turns of the top-3 hits' turns scores
0.664-0.676 | 0.684-0.692 R@10 (multi-hop 0.474-0.491 | 0.437-0.465) in an offline check; the
walk is one way to reach those turns, weighted by Eq. 2.

The graph (stored by `memory.weave`: cluster membership in `graph_nodes`, temporal edges in
`graph_edges`) is loaded once per user index and cached with it.
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np
import polars as pl
import pyarrow as pa

from typing import TYPE_CHECKING

from retrieval.index import UserIndex

if TYPE_CHECKING:
    from retrieval.strategies import Query

log = logging.getLogger(__name__)

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class WalkParams:
    """Eq. 2's hyperparameters (Appendix A.3) and the walk's budget."""

    alpha: float = 1.5
    lam1: float = 0.01     # per day: recency of v relative to the query
    lam2: float = 0.02     # per day: continuity between u and v
    steps: int = 10
    seeds: int = 3         # ours: walks start from this many best-ranked graph nodes
    walks: int = 5         # ours: walks per seed
    restart: float = 0.3   # ours: probability of jumping back to the seed before each step
    cluster: bool = False  # ours: K-means cluster mates are neighbours too (default: temporal edges only)


PARAMS = WalkParams()


@dataclass
class Graph:
    """One user's graph in index row numbers: node i is index row `rows[i]`."""

    rows: np.ndarray                      # index row of each node
    days: np.ndarray                      # node time, days since 1970
    cluster: np.ndarray                   # cluster number of each node
    members: list[np.ndarray]             # node numbers per cluster
    temporal: list[list[tuple[int, float]]]  # (neighbour, gap in days) per node
    #: per node, the index rows of the raw messages (kind "message") it cites in `source_ids`
    cites: list[np.ndarray] = field(default_factory=list)

    @property
    def size(self) -> int:
        return int(self.rows.shape[0])

    def neighbours(self, u: int, cluster: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(neighbour nodes, Δt_uv in days): u's temporal neighbours, plus with `cluster` every other
        node of u's K-means cluster."""
        nb: dict[int, float] = {}
        if cluster:
            nb = {int(v): abs(float(self.days[v] - self.days[u]))
                  for v in self.members[int(self.cluster[u])].tolist() if v != u}
        for v, gap in self.temporal[u]:
            nb[v] = gap
        if not nb:
            return np.zeros(0, np.int64), np.zeros(0)
        keys = np.fromiter(nb.keys(), dtype=np.int64, count=len(nb))
        return keys, np.fromiter(nb.values(), dtype=np.float64, count=len(nb))


def build_graph(index: UserIndex, nodes: pl.DataFrame, edges: pl.DataFrame) -> Graph:
    """The graph of stored rows, restricted to nodes the index holds (memories with a vector)."""
    row_of = index.row_of_id()
    if nodes.height:
        nodes = nodes.sort("seq").filter(pl.col("node_id").is_in(list(row_of)))
    if nodes.height == 0:
        return Graph(np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64), [], [])
    node_ids = nodes["node_id"].to_list()
    num = {nid: i for i, nid in enumerate(node_ids)}
    rows = np.array([row_of[n] for n in node_ids], dtype=np.int64)
    ts = nodes["session_ts"].to_list()
    day = np.array([(t - EPOCH).total_seconds() / 86400.0 for t in ts], dtype=np.float64)
    cids: dict[str, int] = {}
    cluster = np.array([cids.setdefault(c, len(cids)) for c in nodes["cluster_id"].to_list()], dtype=np.int64)
    members = [np.flatnonzero(cluster == c) for c in range(len(cids))]
    temporal: list[list[tuple[int, float]]] = [[] for _ in node_ids]
    if edges.height:
        for src, dst, gap in edges.select(["src_id", "dst_id", "gap_days"]).iter_rows():
            a, b = num.get(src), num.get(dst)
            if a is None or b is None or a == b:
                continue
            temporal[a].append((b, float(gap)))
            temporal[b].append((a, float(gap)))
        temporal = [sorted(t) for t in temporal]   # neighbour order (and so the walk) independent of row order
    return Graph(rows, day, cluster, members, temporal, _cited_messages(index, rows))


def _cited_messages(index: UserIndex, rows: np.ndarray) -> list[np.ndarray]:
    """Index rows of the raw messages (kind "message") each node cites."""
    msg = np.flatnonzero(index.kinds == "message")
    row_of_msg = {}
    if msg.size:
        for r, sources in zip(msg.tolist(), index.meta.column("source_ids").take(pa.array(msg)).to_pylist()):
            for sid in sources or []:
                row_of_msg.setdefault(sid, r)
    out = []
    for sources in index.meta.column("source_ids").take(pa.array(rows)).to_pylist():
        out.append(np.array(sorted({row_of_msg[x] for x in sources or [] if x in row_of_msg}), dtype=np.int64))
    return out


def graph_for(index: UserIndex) -> Graph | None:
    """The user's graph, loaded on first use and kept with the index (None without a store)."""
    store = index.store
    if store is None:
        return None

    def load() -> Graph:
        from memory.weave import load_graph

        nodes, edges = load_graph(store, index.user_id)
        return build_graph(index, nodes, edges)

    return index.memo("memweaver-graph", load)


def _rng(user_id: str, vector: np.ndarray) -> np.random.Generator:
    h = hashlib.blake2b(user_id.encode() + np.asarray(vector, dtype=np.float32).tobytes(), digest_size=8)
    return np.random.default_rng(int.from_bytes(h.digest(), "little"))


@dataclass
class Walked:
    """The nodes visited, in first-visit order, and how often each was visited."""

    nodes: list[int]
    visits: dict[int, int]
    steps: int
    #: per visited non-seed node, the largest Eq. 2 score S(u→v) of a step that reached it
    reach: dict[int, float] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=list)

    def ranked(self) -> list[int]:
        """The unique visited nodes, most visited first (first visit breaks ties)."""
        first = {n: i for i, n in enumerate(self.nodes)}
        return sorted(self.nodes, key=lambda n: (-self.visits[n], first[n]))


def node_weights(graph: Graph, sims: np.ndarray, params: WalkParams | None = None,
                 now_days: float | None = None) -> np.ndarray:
    """cos(q, v)^α · exp(−λ1 Δt_v) per node: the query-dependent part of Eq. 2 (Δt_v in days from
    the query time, by default the user's latest memory)."""
    params = params or PARAMS
    now = float(graph.days.max()) if now_days is None else now_days
    rel = np.clip(sims, 0.0, None) ** params.alpha
    return rel * np.exp(-params.lam1 * np.maximum(now - graph.days, 0.0))


def _scores(graph: Graph, u: int, base: np.ndarray, params: WalkParams) -> tuple[np.ndarray, np.ndarray, float]:
    """(neighbours of u, S(u→v) = base[v] · exp(−λ2 Δt_uv), their sum)."""
    nb, gap = graph.neighbours(u, params.cluster)
    w = base[nb] * np.exp(-params.lam2 * gap) if nb.size else np.zeros(0)
    return nb, w, float(w.sum())


def transitions(graph: Graph, u: int, base: np.ndarray, params: WalkParams | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """(neighbours of u, P(u→v)): S(u→v) normalized over the neighbours (Eq. 2). Empty when u has
    no neighbour with a positive score."""
    nb, w, total = _scores(graph, u, base, params or PARAMS)
    if not total > 0.0:
        return np.zeros(0, np.int64), np.zeros(0)
    return nb, w / total


def walk(graph: Graph, sims: np.ndarray, seeds: list[int], rng: np.random.Generator,
         params: WalkParams | None = None, now_days: float | None = None) -> Walked:
    """Eq. 2 walks of `params.steps` steps, `params.walks` per seed node.

    `sims[i]` = cos(q, node i). Returns unique visited nodes (seeds included) in first-visit order.
    With `params.restart` > 0 each step first returns to the seed with that probability.
    """
    params = params or PARAMS
    if graph.size == 0 or not seeds:
        return Walked([], {}, 0)
    base = node_weights(graph, sims, params, now_days)
    order: list[int] = []
    visits: dict[int, int] = {}
    reach: dict[int, float] = {}
    cache: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}   # u -> (neighbours, cumulative P, S)
    seed_set = set(seeds)
    taken = 0

    def step_from(u: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(neighbours, cumulative P(u→v), S(u→v)) of u, computed once per walk."""
        if u not in cache:
            nb, w, total = _scores(graph, u, base, params)
            cache[u] = (nb, np.cumsum(w / total), w) if total > 0.0 else (np.zeros(0, np.int64), w, w)
        return cache[u]

    for seed in seeds:
        for _ in range(params.walks):
            u = seed
            if u not in visits:
                order.append(u)
            visits[u] = visits.get(u, 0) + 1
            for _ in range(params.steps):
                if params.restart > 0.0 and u != seed and rng.random() < params.restart:
                    u = seed
                nb, cum, s = step_from(u)
                if nb.size == 0:
                    break
                # inverse-CDF draw: what rng.choice(p=...) does, without its per-call checks (~10 µs)
                j = min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), nb.size - 1)
                u = int(nb[j])
                taken += 1
                if u not in visits:
                    order.append(u)
                visits[u] = visits.get(u, 0) + 1
                if u not in seed_set:
                    reach[u] = max(reach.get(u, 0.0), float(s[j]))
    return Walked(order, visits, taken, reach, list(seeds))


def walk_from_scores(index: UserIndex, graph: Graph, vector: np.ndarray, row_scores: np.ndarray,
                     params: WalkParams | None = None) -> Walked:
    """Walk from the `params.seeds` graph nodes best by `row_scores` (one score per index row); nodes
    scored −inf (not searched) are never seeds, and with none left there is no walk."""
    params = params or PARAMS
    z = index.memo("memweaver-graph-z", lambda: np.ascontiguousarray(index.z[graph.rows]))
    sims = z @ vector
    scores = row_scores[graph.rows]
    cand = np.flatnonzero(np.isfinite(scores))
    seeds = cand[np.argsort(-scores[cand], kind="stable")[: params.seeds]]
    return walk(graph, sims, [int(s) for s in seeds], _rng(index.user_id, vector), params)


# -- strategies -------------------------------------------------------------------------------------
#: how walked nodes join the ranking (see `expand`). `by`: the gain of a walked node, "walked" (non-seed
#: nodes: their visits / the most visits of any of them), "visits" (the same, seeds included) or
#: "reach" (non-seed nodes: their best Eq. 2 score S(u→v) / the best of any node); `bonus`: what the
#: top node's targets gain; the targets are the raw messages a walked node cites (`cite`) and/or the
#: node itself (`own`). Chosen on the LoCoMo dev split (module docstring, bench/RESULTS.md).
MERGE = {"by": "walked", "bonus": 0.1, "cite": True, "own": False}
#: how many of the walk's unique visited nodes, most visited first, `signals["walk_nodes"]` lists by id
WALK_NODES_SHOWN = 50


def expand(q: "Query", rows: np.ndarray, ranked: np.ndarray, *, by: str, bonus: float, cite: bool, own: bool
           ) -> tuple[np.ndarray, np.ndarray] | None:
    """The walk as a recollection expansion: (index rows, scores) best first, or None without a graph.

    Walks start from the graph nodes best by `ranked` (the score of each row of `rows`, index rows in
    ascending order as `Query.rows` gives them). Every row
    keeps its `ranked` score; the targets of a walked node (with `cite` the raw messages it cites,
    with `own` the node's own row) gain `bonus` × its gain (see `MERGE`), a row reached through
    several nodes the largest of theirs. So the turns next to the top hits in their conversation,
    which the walks reach along temporal edges, climb over weaker one-off hits.
    """
    index = q.index
    graph = graph_for(index)
    if graph is None or graph.size == 0:
        return None
    full = np.full(index.size, -np.inf, dtype=np.float64)
    full[rows] = ranked
    walked = walk_from_scores(index, graph, q.vector, full)
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
    top = max(gain.values(), default=1.0) or 1.0
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
                add[i] = max(add.get(i, 0.0), bonus * g / top)
    for i, x in add.items():
        score[i] += x
    q.signals["walk_boosted"] = len(add)
    from retrieval.rfmem import top_k
    from retrieval.strategies import DEDUPE_POOL

    order = top_k(score, q.k * DEDUPE_POOL)
    return rows[order], score[order].astype(np.float32)


def walk_strategy(q: "Query", *, gate: bool, fused: bool) -> tuple[np.ndarray, np.ndarray, str | None]:
    """`walk` / `hybrid-walk` (always walk, from the cosine or the fused ranking), `rfmem-walk` /
    `rfmem-hybrid-walk` (RF-Mem's gate; its recollection route is the walk instead of Algorithm 3).
    Users without a graph get RF-Mem's recollection."""
    from retrieval import rfmem
    from retrieval.strategies import _novel, _rfmem, _subset, _thresholds, _top, familiarity_signal

    s = q.settings
    rows, z = _subset(q)
    if rows.size == 0:
        return rows, np.zeros(0, np.float32), rfmem.RECOLLECTION
    probe = z @ q.vector
    route = rfmem.RECOLLECTION
    if gate:
        mean, ent = familiarity_signal(q, probe)
        route = rfmem.gate(mean, ent, *_thresholds(q, False))
    ranked = probe + q.prior(rows, probe) if fused else probe
    if route == rfmem.FAMILIARITY:
        return _top(q, rows, ranked, route, fused and s.dedupe_sources)
    out = expand(q, rows, ranked, **MERGE)
    if out is None:
        return _rfmem(q, route=rfmem.RECOLLECTION, fused=fused)
    idx, sc = out
    if s.dedupe_sources:  # as the hybrid strategies: boosted turns often repeat a fragment above them
        return _novel(q, idx, sc, rfmem.RECOLLECTION)
    return idx[: q.k], sc[: q.k], rfmem.RECOLLECTION
