"""Per-session clustering by silhouette and linking against the persistent pool (PREMem §3.2.1)."""
from __future__ import annotations

from datetime import datetime, timezone

import numpy as np

from memory.stages.link import choose_labels, cluster_session, link_session


def _blobs(centers: list[np.ndarray], per: int, noise: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = [c + noise * rng.standard_normal(c.shape) for c in centers for _ in range(per)]
    m = np.stack(rows)
    return (m / np.linalg.norm(m, axis=1, keepdims=True)).astype(np.float32)


def _axes(dim: int, *idx: int) -> list[np.ndarray]:
    out = []
    for i in idx:
        v = np.zeros(dim)
        v[i] = 1.0
        out.append(v)
    return out


def test_silhouette_recovers_three_groups() -> None:
    vecs = _blobs(_axes(16, 0, 5, 9), per=6, noise=0.05, seed=1)
    labels = choose_labels(vecs, max_clusters=8)
    assert len(set(labels.tolist())) == 3
    for g in range(3):
        assert len(set(labels[g * 6:(g + 1) * 6].tolist())) == 1


def test_tiny_sessions_make_one_cluster() -> None:
    vecs = _blobs(_axes(8, 0), per=2, noise=0.01, seed=2)
    assert choose_labels(vecs).tolist() == [0, 0]


def test_clusters_are_deterministic_and_cover_every_fragment() -> None:
    vecs = _blobs(_axes(16, 1, 2), per=5, noise=0.05, seed=3)
    ids = [f"f{i}" for i in range(len(vecs))]
    ts = datetime(2024, 1, 1, tzinfo=timezone.utc)
    a = cluster_session("u", "s1", ts, ids, vecs)
    b = cluster_session("u", "s1", ts, ids, vecs)
    assert [c.id for c in a] == [c.id for c in b]
    assert sorted(i for c in a for i in c.member_ids) == sorted(ids)


def test_pool_update_follows_the_paper() -> None:
    """P_i = P_{i-1} minus matched p, plus all of C_i; pairs only above θ."""
    t1, t2 = datetime(2024, 1, 1, tzinfo=timezone.utc), datetime(2024, 2, 1, tzinfo=timezone.utc)
    s1 = cluster_session("u", "s1", t1, [f"a{i}" for i in range(10)], _blobs(_axes(16, 0, 5), 5, 0.05, 4))
    s2 = cluster_session("u", "s2", t2, [f"b{i}" for i in range(10)], _blobs(_axes(16, 0, 11), 5, 0.05, 5))
    links, pool = link_session([], s1, theta=0.6)
    assert links == [] and len(pool) == 2
    links, pool = link_session(pool, s2, theta=0.6)
    assert len(links) == 1
    (lk,) = links
    assert lk.similarity > 0.6
    assert lk.pool.consumed_ts == t2 and lk.pool.consumed_by == lk.new.id
    assert lk.pool not in pool
    assert {c.id for c in s2} <= {c.id for c in pool} and len(pool) == 3
