"""MemWeaver behavioral memory (Yu et al., §3.3.1 and §3.3.3): each user's memory graph.

Nodes are the user's fragments and insights in time order (session time, then fragments before
insights, then the position of the first cited message). Two kinds of undirected edges:

* temporal: consecutive nodes, stored in `graph_edges` with their gap Δt_uv in days and the cosine of
  the two memories (the Eq. 2 continuity term needs the gap; nothing else gives it);
* semantic: every pair of nodes in the same K-means cluster. They are *not* stored: a clique per
  cluster would be O(n²) rows. `graph_nodes.cluster_id` is the membership; the weight of a semantic
  edge is the cosine of its two memories' vectors, which the retriever already holds.

K-means runs on the unit vectors with K = 5 (the paper's value), bounded by the batch size: at most
one cluster per `MIN_CLUSTER_SIZE` nodes (few nodes), at least one per `MAX_CLUSTER_SIZE` nodes (very
many; a 10k-node clique would make every walk step touch thousands of neighbours and mix topics).
It is scikit-learn's KMeans with a fixed `random_state` and `n_init` over nodes in a fixed order, so a
re-run gives the same labels, and cluster ids are hashes of the user, the batch and the label.

Incremental (§3.3.3): a consolidation run weaves only the user's new memories as one batch, clustered
on its own; its first node is linked to the last node already woven. Nodes of sessions newer than
the user's watermark are ignored when reading the stored graph, so a run redone after a crash
rebuilds the same rows. A user whose stored memories are not all woven (a store consolidated before
this stage existed, or a rebuild interrupted after its delete) is rebuilt; `Settings.rebuild_graph`
(`mnemo consolidate --rebuild-graph`) rebuilds every user of the run: all memories as one batch, the
user's old rows deleted by `commit` before the new ones are written.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import polars as pl
from lancedb.expr import col, lit

from memory.ids import make_id
from memory.schemas import MEMORY_TABLES
from memory.settings import Settings
from memory.store import Store

log = logging.getLogger(__name__)

WEAVE_VERSION = "memweaver-weave-v1"
K_DEFAULT = 5
MIN_CLUSTER_SIZE = 3
MAX_CLUSTER_SIZE = 100
KMEANS_N_INIT = 4
KMEANS_SEED = 0
KIND_RANK = {"fragment": 0, "insight": 1}


@dataclass
class Node:
    """One memory as a node: what weave and summarize need of a fragment or insight."""

    id: str
    kind: str
    session_ts: datetime
    position: int            # seq of the first cited message (0 for insights)
    vector: np.ndarray
    source_ids: list[str]
    text: str = ""
    date: str = ""
    session_id: str = ""

    def order(self) -> tuple[Any, ...]:
        return (self.session_ts, KIND_RANK.get(self.kind, 2), self.position, self.id)


def days(a: datetime, b: datetime) -> float:
    """|b - a| in days (the unit of every Δt of the graph and the walk)."""
    return abs((b - a).total_seconds()) / 86400.0


def choose_k(n: int, k: int = K_DEFAULT, min_size: int = MIN_CLUSTER_SIZE, max_size: int = MAX_CLUSTER_SIZE) -> int:
    """K for a batch of n nodes: k, but at least ceil(n / max_size) and at most n // min_size (≥ 1)."""
    if n <= 0:
        return 0
    return max(1, min(max(k, -(-n // max_size)), n // min_size))


def cluster_labels(vectors: np.ndarray, k: int) -> np.ndarray:
    """K-means labels, renumbered by first occurrence so they do not depend on the solver's order."""
    n = len(vectors)
    if k <= 1 or n <= 1:
        return np.zeros(n, dtype=int)
    from sklearn.cluster import KMeans

    raw = KMeans(n_clusters=k, n_init=KMEANS_N_INIT, random_state=KMEANS_SEED).fit_predict(
        np.asarray(vectors, dtype=np.float64))
    remap: dict[int, int] = {}
    for lab in raw.tolist():
        remap.setdefault(lab, len(remap))
    return np.array([remap[lab] for lab in raw.tolist()], dtype=int)


def _unit(v: np.ndarray) -> np.ndarray:
    return v / max(float(np.linalg.norm(v)), 1e-12)


def weave_batch(user: str, nodes: list[Node], last: dict[str, Any] | None, run_id: str,
                k: int = K_DEFAULT) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows of `graph_nodes` and `graph_edges` for one batch of new nodes (already in time order).

    `last`: the last woven node {"node_id", "seq", "session_ts", "vector"} or None for a first batch.
    """
    if not nodes:
        return [], []
    vecs = np.stack([n.vector for n in nodes]).astype(np.float32)
    labels = cluster_labels(vecs, choose_k(len(nodes), k))
    batch_id = make_id(user, "graph-batch", WEAVE_VERSION, nodes[0].id, nodes[-1].id, len(nodes))
    start_seq = int(last["seq"]) + 1 if last else 0
    node_rows: list[dict[str, Any]] = []
    for lab in range(int(labels.max()) + 1):
        idx = np.flatnonzero(labels == lab)
        centroid = _unit(vecs[idx].mean(axis=0))
        cid = make_id(user, "graph-cluster", batch_id, lab)
        for i in idx.tolist():
            n = nodes[i]
            node_rows.append({
                "id": make_id(user, "graph-node", n.id), "user_id": user, "node_id": n.id, "kind": n.kind,
                "seq": start_seq + i, "session_ts": n.session_ts, "cluster_id": cid, "cluster_size": len(idx),
                "centroid_sim": float(vecs[i] @ centroid), "batch_id": batch_id, "run_id": run_id,
                "weave_version": WEAVE_VERSION})
    node_rows.sort(key=lambda r: r["seq"])
    edges: list[dict[str, Any]] = []

    def edge(src: str, dst: str, ts_a: datetime, ts_b: datetime, va: np.ndarray, vb: np.ndarray) -> None:
        edges.append({"id": make_id(user, "graph-edge", src, dst), "user_id": user, "src_id": src, "dst_id": dst,
                      "kind": "temporal", "gap_days": days(ts_a, ts_b), "similarity": float(va @ vb),
                      "run_id": run_id})

    if last is not None:
        edge(last["node_id"], nodes[0].id, last["session_ts"], nodes[0].session_ts,
             np.asarray(last["vector"], dtype=np.float32), vecs[0])
    for a, b, va, vb in zip(nodes, nodes[1:], vecs, vecs[1:]):
        edge(a.id, b.id, a.session_ts, b.session_ts, va, vb)
    return node_rows, edges


# -- reading memories ---------------------------------------------------------------------------
def new_nodes(state: Any, user: str, kinds: tuple[str, ...] = ("fragment", "insight")) -> list[Node]:
    """The shard's new memories of one user as nodes (unordered)."""
    seqs = {m["message_id"]: int(m.get("seq") or 0) for m in state.message_rows if m["user_id"] == user}
    out = []
    if "fragment" in kinds:
        out += [_node(f, "fragment", seqs) for f in state.fragments
                if f["user_id"] == user and f.get("vector") is not None]
    if "insight" in kinds:
        out += [_node(r, "insight", seqs) for r in state.insights
                if r["user_id"] == user and r.get("vector") is not None]
    return out


def stored_nodes(store: Store, user: str, until: datetime,
                 kinds: tuple[str, ...] = ("fragment", "insight")) -> list[Node]:
    """The user's stored memories of sessions up to `until` (the watermark) as nodes."""
    msgs = store.read("messages", user, columns=["message_id", "seq"])
    seqs = dict(zip(msgs.column("message_id").to_pylist(), msgs.column("seq").to_pylist()))
    out = []
    for kind in kinds:
        cols = ["id", "session_id", "session_ts", "source_ids", "vector", "text", "date"]
        t = pl.from_arrow(store.read(MEMORY_TABLES[kind], user, columns=cols))
        if t.height == 0:
            continue
        t = t.filter(pl.col("session_ts") <= until)
        out += [_node(r, kind, seqs) for r in t.iter_rows(named=True) if r["vector"] is not None]
    return out


def with_stored(batch: list[Node], store: Store, user: str, until: datetime,
                kinds: tuple[str, ...] = ("fragment", "insight")) -> list[Node]:
    """The shard's new nodes plus the user's stored ones up to `until`: a rebuild's input (unordered)."""
    known = {n.id for n in batch}
    return batch + [n for n in stored_nodes(store, user, until, kinds) if n.id not in known]


def stored_ids(store: Store, user: str, until: datetime, kinds: tuple[str, ...]) -> set[str]:
    out: set[str] = set()
    for kind in kinds:
        t = pl.from_arrow(store.read(MEMORY_TABLES[kind], user, columns=["id", "session_ts"]))
        if t.height:
            out |= set(t.filter(pl.col("session_ts") <= until)["id"].to_list())
    return out


def _node(r: dict[str, Any], kind: str, seqs: dict[str, Any]) -> Node:
    sources = list(r.get("source_ids") or [])
    pos = min((int(seqs[s]) for s in sources if seqs.get(s) is not None), default=0) if kind == "fragment" else 0
    return Node(id=r["id"], kind=kind, session_ts=r["session_ts"], position=pos,
                vector=np.asarray(r["vector"], dtype=np.float32), source_ids=sources, text=r.get("text") or "",
                date=r.get("date") or "", session_id=r.get("session_id") or "")


def has_stored(state: Any, user: str) -> bool:
    """Whether the user may have stored memories up to its watermark. False for a user never
    consolidated (watermark `(EPOCH, 0)` from `load_shard`: every user of a backfill): consolidation
    only takes sessions after the watermark, so nothing stored is that old and the stages skip the
    reads of stored memories (they would all be filtered out)."""
    return state.watermarks[user][1] > 0


def add_rows(state: Any, table: str, rows: list[dict[str, Any]]) -> None:
    state.extra.setdefault(table, []).extend(rows)


def replace_user(state: Any, table: str, user: str) -> None:
    """Ask `commit` to delete the user's rows of `table` before writing the new ones."""
    users = state.replace.setdefault(table, [])
    if user not in users:
        users.append(user)


def users_to_update(state: Any, settings: Settings, kinds: tuple[str, ...]) -> list[str]:
    """Users with new memories of these kinds, or every user of the shard on a rebuild."""
    if settings.rebuild_graph:
        return list(state.users)
    have = {f["user_id"] for f in state.fragments} if "fragment" in kinds else set()
    if "insight" in kinds:
        have |= {r["user_id"] for r in state.insights}
    return [u for u in state.users if u in have]


# -- the stage ------------------------------------------------------------------------------------
def weave(state: Any, store: Store, settings: Settings) -> Any:
    """Weave the shard's new memories into each user's graph (or rebuild it)."""
    from memory.pipeline import _timed

    start = time.perf_counter()
    n_nodes = n_edges = 0
    for user in users_to_update(state, settings, ("fragment", "insight")):
        until = state.watermarks[user][0]
        stored = has_stored(state, user)
        batch = new_nodes(state, user)
        last = None
        rebuild = settings.rebuild_graph
        if not rebuild and stored:
            woven = pl.from_arrow(store.read("graph_nodes", user, columns=["node_id", "seq", "session_ts"]))
            woven = woven.filter(pl.col("session_ts") <= until) if woven.height else woven
            missing = stored_ids(store, user, until, ("fragment", "insight")) - set(woven["node_id"].to_list()
                                                                                      if woven.height else [])
            if missing:
                log.info("user %s has %d memories outside its graph: rebuilding it", user, len(missing))
                rebuild = True
            elif woven.height:
                tail = woven.sort("seq").row(-1, named=True)
                last = dict(tail)
                last["vector"] = _vector_of(store, user, tail["node_id"])
                if last["vector"] is None:
                    rebuild, last = True, None
        if rebuild:
            replace_user(state, "graph_nodes", user)
            replace_user(state, "graph_edges", user)
            if stored:
                batch = with_stored(batch, store, user, until)
        batch.sort(key=Node.order)
        nodes, edges = weave_batch(user, batch, last, state.run_id)
        add_rows(state, "graph_nodes", nodes)
        add_rows(state, "graph_edges", edges)
        n_nodes += len(nodes)
        n_edges += len(edges)
    _timed(state, "weave", start)
    log.debug("weave: %d nodes, %d temporal edges", n_nodes, n_edges)
    return state


def _vector_of(store: Store, user: str, node_id: str) -> np.ndarray | None:
    for kind in ("fragment", "insight"):
        t = store.read(MEMORY_TABLES[kind], user, columns=["id", "vector"], where=col("id") == lit(node_id))
        if t.num_rows:
            return np.asarray(t.column("vector")[0].as_py(), dtype=np.float32)
    return None


def load_graph(store: Store, user: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(nodes ordered by seq, temporal edges) of one user's stored graph."""
    nodes = pl.from_arrow(store.read("graph_nodes", user))
    edges = pl.from_arrow(store.read("graph_edges", user))
    return (nodes.sort("seq") if nodes.height else nodes), edges
