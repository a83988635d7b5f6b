"""MemWeaver's context-aware random walk (Yu et al. §3.3.1, Eq. 2) over one user's memory graph.

The algorithm and the graph it walks; `retrieval.strategies.walk` turns a walk into a ranking.

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
  (fragments and insights; raw messages and topics are not nodes). Before each step a walk jumps
  back to its seed with probability `restart` = 0.3, so visits concentrate around the seeds.
* **Neighbours: temporal edges only** (`WalkParams.cluster` = False). A stored K-means cluster holds
  a large share of a user's nodes, so a cluster neighbourhood is "everything similar", and Eq. 2
  over it draws destinations by cos(q, v)^1.5, i.e. re-samples the cosine ranking. Along temporal
  edges (consecutive nodes: the next and previous memory of the conversation) Eq. 2 picks the more
  relevant and more recent side and the walk explores the turns around each top hit, which one-shot
  search cannot see.

The graph (stored by the weave stage: cluster membership in `graph_nodes`, temporal edges in
`graph_edges`, read through `UserIndex.read` at the index's snapshot) is loaded once per user index and cached
with it.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np
import polars as pl
import pyarrow as pa

from retrieval.index import UserIndex

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
    row_of_msg: dict[str, int] = {}
    if msg.size:
        for r, sources in zip(msg.tolist(), index.meta.column("source_ids").take(pa.array(msg)).to_pylist()):
            for sid in sources or []:
                row_of_msg.setdefault(sid, r)
    out = []
    for sources in index.meta.column("source_ids").take(pa.array(rows)).to_pylist():
        out.append(np.array(sorted({row_of_msg[x] for x in sources or [] if x in row_of_msg}), dtype=np.int64))
    return out


def _frame(table: pa.Table) -> pl.DataFrame:
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    return df


def graph_for(index: UserIndex) -> Graph | None:
    """The user's graph, loaded on first use and kept with the index (None without a store)."""
    store = index.store
    if store is None:
        return None

    def load() -> Graph:   # at the index's snapshot, like its rows
        nodes, edges = _frame(index.read("graph_nodes")), _frame(index.read("graph_edges"))
        return build_graph(index, nodes.sort("seq") if nodes.height else nodes, edges)

    return index.memo("memweaver-graph", load)


def walk_rng(user_id: str, vector: np.ndarray, text: str | None = None) -> np.random.Generator:
    """The walk's random generator, seeded by the user id and the query's text when given, else its
    vector (same query, same walk): the vector's last bits differ between a threaded and a
    single-threaded embedder (the service's), which made the service walk elsewhere."""
    key = text.encode("utf-8", "surrogatepass") if text is not None else \
        np.asarray(vector, dtype=np.float32).tobytes()
    h = hashlib.blake2b(user_id.encode() + b"\0" + key, digest_size=8)
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
                     params: WalkParams | None = None, text: str | None = None) -> Walked:
    """Walk from the `params.seeds` graph nodes best by `row_scores` (one score per index row); nodes
    scored −inf (not searched) are never seeds, and with none left there is no walk; `text` (the
    query's) seeds the walk's draws."""
    params = params or PARAMS
    z = index.memo("memweaver-graph-z", lambda: np.ascontiguousarray(index.z[graph.rows]))
    sims = z @ vector
    scores = row_scores[graph.rows]
    cand = np.flatnonzero(np.isfinite(scores))
    seeds = cand[np.argsort(-scores[cand], kind="stable")[: params.seeds]]
    return walk(graph, sims, [int(s) for s in seeds], walk_rng(index.user_id, vector, text), params)
