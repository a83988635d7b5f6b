"""PREMem step 2a: per-session clustering chosen by silhouette, and cross-session linking
against the persistent cluster pool (cosine of centroids > θ).

Clustering is average-linkage agglomerative on cosine distance (SciPy), cut at the k in
2..max_clusters with the best silhouette (scikit-learn). The paper fixes only the silhouette
criterion; agglomerative cuts are deterministic (no random restarts, so re-runs and split
batches give identical clusters) and reuse one distance matrix for every k.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform
from sklearn.metrics import silhouette_score

from memory.ids import make_id


@dataclass
class Cluster:
    """A group of fragments of one session, with its (unnormalized) centroid."""

    id: str
    user_id: str
    session_id: str
    session_ts: datetime
    member_ids: list[str]
    centroid: np.ndarray
    consumed_ts: datetime | None = None
    consumed_by: str | None = None

    def row(self, run_id: str) -> dict:
        return {
            "id": self.id, "user_id": self.user_id, "session_id": self.session_id,
            "session_ts": self.session_ts, "member_ids": self.member_ids, "size": len(self.member_ids),
            "centroid": self.centroid.astype(np.float32), "consumed_ts": self.consumed_ts,
            "consumed_by": self.consumed_by, "run_id": run_id,
        }


@dataclass
class Link:
    """A connected pair (p from the pool, c from the new session) with sim(p, c) > θ."""

    pool: Cluster
    new: Cluster
    similarity: float
    id: str = field(init=False)

    def __post_init__(self) -> None:
        self.id = make_id(self.new.user_id, self.pool.id, self.new.id)

    def row(self, run_id: str) -> dict:
        return {
            "id": self.id, "user_id": self.new.user_id, "pool_cluster_id": self.pool.id,
            "new_cluster_id": self.new.id, "session_id": self.new.session_id,
            "similarity": self.similarity, "run_id": run_id,
        }


def choose_labels(vectors: np.ndarray, max_clusters: int = 8) -> np.ndarray:
    """Cluster labels (0..k-1) for one session's fragment vectors, k chosen by silhouette."""
    n = len(vectors)
    if n < 3:
        return np.zeros(n, dtype=int)
    dist = np.clip(1.0 - vectors @ vectors.T, 0.0, 2.0)
    np.fill_diagonal(dist, 0.0)
    dist = (dist + dist.T) / 2
    tree = linkage(squareform(dist, checks=False), method="average")
    best_labels, best_score = np.zeros(n, dtype=int), -1.0
    for k in range(2, min(max_clusters, n - 1) + 1):
        labels = fcluster(tree, k, criterion="maxclust")
        if len(set(labels)) < 2:
            continue
        score = silhouette_score(dist, labels, metric="precomputed")
        if score > best_score + 1e-9:
            best_score, best_labels = score, labels - 1
    return np.asarray(best_labels, dtype=int)


def cluster_session(
    user_id: str, session_id: str, session_ts: datetime, fragment_ids: list[str],
    vectors: np.ndarray, max_clusters: int = 8,
) -> list[Cluster]:
    """The clusters C_i of one session, members in input order, ids from the member set."""
    if not fragment_ids:
        return []
    labels = choose_labels(vectors, max_clusters)
    clusters = []
    for label in sorted(set(labels.tolist()), key=lambda lab: int(np.argmax(labels == lab))):
        idx = np.flatnonzero(labels == label)
        members = [fragment_ids[i] for i in idx]
        clusters.append(Cluster(
            id=make_id(user_id, session_id, *sorted(members)), user_id=user_id, session_id=session_id,
            session_ts=session_ts, member_ids=members, centroid=vectors[idx].mean(axis=0),
        ))
    return clusters


def link_session(pool: list[Cluster], new: list[Cluster], theta: float) -> tuple[list[Link], list[Cluster]]:
    """CP_i = {(p, c): cos(p̄, c̄) > θ} and the updated pool P_i = P_{i-1} minus matched p, plus C_i.

    A matched pool cluster is marked consumed by the new cluster it is most similar to.
    """
    if not pool or not new:
        return [], pool + new
    p_mat = _unit(np.stack([p.centroid for p in pool]))
    c_mat = _unit(np.stack([c.centroid for c in new]))
    sims = p_mat @ c_mat.T
    links: list[Link] = []
    consumed: set[int] = set()
    for i, j in zip(*np.nonzero(sims > theta)):
        links.append(Link(pool=pool[i], new=new[j], similarity=float(sims[i, j])))
        consumed.add(int(i))
    for i in consumed:
        best = int(np.argmax(sims[i]))
        pool[i].consumed_ts = new[best].session_ts
        pool[i].consumed_by = new[best].id
    remaining = [p for i, p in enumerate(pool) if i not in consumed]
    return links, remaining + new


def _unit(m: np.ndarray) -> np.ndarray:
    return m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)
