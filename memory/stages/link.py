"""The link stage, PREMem step 2a: per-session clustering chosen by silhouette, and cross-session
linking against the user's persistent cluster pool (cosine of centroids > θ).

Sessions are linked in time order, each against the pool as it stands after the earlier ones. A
reopened session (messages appended after its consolidation) clusters its new fragments on their
own and links them against the pool without its own older clusters (links are across sessions). A
late session (dated before the watermark), like a reopened one, links in time order: its clusters
against the pool clusters of earlier sessions (the pool side is the earlier), then the pool
clusters of later sessions against its clusters (its cluster is the earlier side, consumed at the
later session's time, the insight dated there); the pool stays in time order. Clusters that were in
the pool at the late session's time but that later sessions consumed before it arrived
(`ShardState.consumed`) link to it too, as they would have on time, and stay with their consumers:
their consumption is not redone (nor by a full `--rebuild-graph`, which does not redo links).

Clustering is average-linkage agglomerative on cosine distance (SciPy), cut at the k in
2..max_clusters with the best silhouette (scikit-learn). The paper fixes only the silhouette
criterion; agglomerative cuts are deterministic (no random restarts, so re-runs and split
batches give identical clusters) and reuse one distance matrix for every k.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform
from sklearn.metrics import silhouette_score

from memory.ids import make_id
from memory.stages.shard import Cluster, Link, ShardState, StageContext, timed


def link(state: ShardState, ctx: StageContext) -> ShardState:
    """Cluster each session's fragments and link them to the user's pool, session by session."""
    with timed(state, "link"):
        by_session: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for f in state.fragments:
            by_session.setdefault((f["user_id"], f["session_id"]), []).append(f)
        for session in state.sessions:
            frags = by_session.get((session.user_id, session.session_id), [])
            if not frags:
                continue
            vecs = np.stack([f["vector"] for f in frags])
            clusters = cluster_session(session.user_id, session.session_id, session.ts,
                                       [f["id"] for f in frags], vecs, ctx.settings.max_clusters)
            by_id = {f["id"]: f for f in frags}
            for c in clusters:
                for fid in c.member_ids:
                    by_id[fid]["cluster_id"] = c.id
            pool = state.pools.get(session.user_id, [])
            own = [p for p in pool if p.session_id == session.session_id]  # a reopened session's clusters
            others = [p for p in pool if p.session_id != session.session_id]
            before = [p for p in others if p.session_ts <= session.ts]
            after = [p for p in others if p.session_ts > session.ts]       # only for a late or reopened one
            since = [p for p in state.consumed.get(session.user_id, []) if p.session_id != session.session_id]
            links, rest = link_session(before, clusters, ctx.settings.theta)
            # clusters of earlier sessions live at this one's time and consumed since: linked, left consumed
            links += linked_pairs([p for p in since if p.session_ts <= session.ts < (p.consumed_ts or p.session_ts)],
                                  clusters, ctx.settings.theta)
            gone = [p for p in since if p.session_ts > session.ts]          # later sessions' consumed clusters
            if after or gone:   # clusters of later sessions link to this one's as they would have on time
                mine = {c.id for c in clusters}
                late_links, rest_after = link_session([c for c in rest if c.id in mine], after + gone,
                                                      ctx.settings.theta)
                links += late_links
                consumed = {p.id for p in gone}
                rest = [p for p in rest if p.id not in mine] + [p for p in rest_after if p.id not in consumed]
            state.pools[session.user_id] = sorted(own + rest, key=lambda c: c.session_ts)
            state.clusters.extend(clusters)
            state.links.extend(links)
    return state


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
    sims = similarities(pool, new)
    links = linked_pairs(pool, new, theta, sims)
    consumed = np.flatnonzero((sims > theta).any(axis=1)).tolist()
    for i in consumed:
        best = int(np.argmax(sims[i]))
        pool[i].consumed_ts = new[best].session_ts
        pool[i].consumed_by = new[best].id
    remaining = [p for i, p in enumerate(pool) if i not in consumed]
    return links, remaining + new


def linked_pairs(pool: list[Cluster], new: list[Cluster], theta: float,
                 sims: np.ndarray | None = None) -> list[Link]:
    """CP = {(p, c): cos(p̄, c̄) > θ}, the pool's consumption untouched (`sims`: pool × new cosines,
    when already computed)."""
    if not pool or not new:
        return []
    sims = similarities(pool, new) if sims is None else sims
    return [Link(pool=pool[i], new=new[j], similarity=float(sims[i, j])) for i, j in zip(*np.nonzero(sims > theta))]


def similarities(pool: list[Cluster], new: list[Cluster]) -> np.ndarray:
    """Cosines of the pool clusters' centroids (rows) to the new clusters' (columns)."""
    return _unit(np.stack([p.centroid for p in pool])) @ _unit(np.stack([c.centroid for c in new])).T


def _unit(m: np.ndarray) -> np.ndarray:
    return m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)
