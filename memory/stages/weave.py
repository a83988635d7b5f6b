"""The weave stage, MemWeaver behavioral memory (Yu et al., §3.3.1 and §3.3.3): each user's memory graph.

Nodes are the user's fragments and insights in time order (`memory.graph.Node.order`: session time,
then session id, then fragments before insights, then the position of the first cited message). Two kinds of
undirected edges:

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
on its own; its first node is linked to the last node already woven. A batch holding a memory that
sorts before the last woven node (`Node.order`: a late session; messages appended to an older
session, or to the latest one, whose fragments sort before its insights; a session of the same time
sorting first) re-weaves the user's whole graph in time order instead, as a rebuild would (no LLM work:
K-means and the chain), so `seq` and the temporal edges always follow that order. Nodes of sessions
newer than the user's watermark are ignored when reading the stored graph, and `commit` deletes those
a run redone after a crash does not write again, so it converges. A user whose stored memories are
not all woven (a store consolidated before this stage existed, or a rebuild interrupted after its
delete) is rebuilt; `Settings.rebuild_graph` (`mnemo consolidate --rebuild-graph`) rebuilds every
user of the run: all memories as one batch, the user's old rows deleted by `commit` once the new
ones are written.
"""
from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import numpy as np
import polars as pl

from memory.graph import Node, days, stored_ids, stored_nodes, with_stored
from memory.ids import make_id
from memory.stages.shard import (ShardState, StageContext, add_rows, frame, has_stored, new_nodes, replace_user,
                                 timed, users_to_update)

log = logging.getLogger(__name__)

WEAVE_VERSION = "memweaver-weave-v1"
K_DEFAULT = 5
MIN_CLUSTER_SIZE = 3
MAX_CLUSTER_SIZE = 100
KMEANS_N_INIT = 4
KMEANS_SEED = 0


def weave(state: ShardState, ctx: StageContext) -> ShardState:
    """Weave the shard's new memories into each user's graph (or rebuild it)."""
    store, settings = ctx.store, ctx.settings
    n_nodes = n_edges = 0
    with timed(state, "weave"):
        for user in users_to_update(state, settings, ("fragment", "insight")):
            until = state.watermarks[user][0]
            stored = has_stored(state, user)
            batch = new_nodes(state, user)
            last = None
            rebuild = settings.rebuild_graph
            if not rebuild and stored:
                woven = frame(store.read("graph_nodes", user, columns=["node_id", "seq", "session_ts"]))
                woven = woven.filter(pl.col("session_ts") <= until) if woven.height else woven
                missing = stored_ids(store, user, until, ("fragment", "insight")) - set(woven["node_id"].to_list()
                                                                                          if woven.height else [])
                if missing:
                    log.info("user %s has %d memories outside its graph: rebuilding it", user, len(missing))
                    rebuild = True
                elif woven.height:
                    tail = woven.sort("seq").row(-1, named=True)
                    found = stored_nodes(store, user, until, ids=[tail["node_id"]])
                    if not found:
                        rebuild = True
                    elif batch and min(n.order() for n in batch) < found[0].order():
                        log.info("user %s has memories ordered inside its graph (a late or reopened session, "
                                 "one of the same time): re-weaving it in time order", user)
                        rebuild = True
                    else:
                        last = {**tail, "vector": found[0].vector}
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
    log.debug("weave: %d nodes, %d temporal edges", n_nodes, n_edges)
    return state


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
    from sklearn.cluster import KMeans  # heavy: only when a batch has more than one cluster

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

