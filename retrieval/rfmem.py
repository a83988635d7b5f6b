"""RF-Mem (Recollection–Familiarity Memory Retrieval) in NumPy, over one user's matrix of unit rows.

Paper: §2.1 (familiarity signal, gate), §2.2 and Appendix E (Algorithms 1–3). Every function here
is pure: scores come from `Z @ x` on a cached matrix, so a recollection round never queries
LanceDB. `prior` is an optional per-row additive score (kind weights, lexical fusion) applied
where rows are *ranked*; the familiarity signal always uses the raw cosine scores of the probe.

Entropy normalization: the paper's H(p) (Eq. 2) is in nats and ranges over [0, log k]. We divide
it by log k (`normalized=True`, the default) so that τ means "share of the maximal uncertainty"
and one τ serves every probe size k (the service accepts any k; the benchmark uses 5 and 10).
With `normalized=False` the value is the paper's raw H(p).

Gate: we follow Eq. 3 (mean score first, entropy only inside (θ_low, θ_high)). Algorithm 1's
"s̄ ≥ θ_high or H ≤ τ" differs only when s̄ ≤ θ_low and H ≤ τ; Eq. 3 (recollection) is the
formal policy and the one Appendix F proves optimal, so it wins.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)

FAMILIARITY = "familiarity"
RECOLLECTION = "recollection"


def _norm(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(n, 1e-12)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores, best first (ties by index)."""
    k = min(k, scores.shape[0])
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    if k < scores.shape[0]:
        part = np.argpartition(-scores, k - 1)[:k]
    else:
        part = np.arange(scores.shape[0])
    return part[np.lexsort((part, -scores[part]))]


def familiarity_signal(scores: np.ndarray, lam: float, normalized: bool = True) -> tuple[float, float]:
    """(mean score s̄, entropy H) of probe scores (Eqs. 1–2); H / log k when `normalized`."""
    s = np.asarray(scores, dtype=np.float64)
    if s.size == 0:
        return 0.0, 1.0 if normalized else 0.0
    z = lam * (s - s.max())
    p = np.exp(z)
    p /= p.sum()
    h = float(-(p * np.log(np.maximum(p, 1e-300))).sum())
    if normalized:
        h = float(h / np.log(s.size)) if s.size > 1 else 0.0
    return float(s.mean()), h


def gate(mean: float, entropy: float, theta_high: float, theta_low: float, tau: float) -> str:
    """Eq. 3: familiarity when s̄ ≥ θ_high; recollection when s̄ ≤ θ_low; else H ≤ τ decides."""
    if mean >= theta_high:
        return FAMILIARITY
    if mean <= theta_low:
        return RECOLLECTION
    return FAMILIARITY if entropy <= tau else RECOLLECTION


def kmeans(x: np.ndarray, k: int, iters: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """(labels, centers) of a small deterministic KMeans (Lloyd) on the rows of x.

    Initialization: the first row (the best-scored candidate), then farthest points. Written for
    the N ≤ 20 points of a recollection round, where it takes tens of microseconds and
    scikit-learn's KMeans milliseconds of fixed overhead; deterministic, so results reproduce.
    """
    n = x.shape[0]
    k = max(1, min(k, n))
    sq = (x * x).sum(axis=1)
    d2_all = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (x @ x.T), 0.0)
    centers = [0]
    d2 = d2_all[0].copy()
    while len(centers) < k:
        far = int(np.argmax(d2))
        if d2[far] <= 1e-12:
            break  # identical points: fewer clusters than asked
        centers.append(far)
        d2 = np.minimum(d2, d2_all[far])
    labels = d2_all[:, centers].argmin(axis=1)
    c = x[centers].astype(np.float64)
    onehot = np.zeros((len(centers), n))
    for _ in range(max(1, iters)):
        onehot[:] = 0.0
        onehot[labels, np.arange(n)] = 1.0
        counts = onehot.sum(axis=1)
        filled = counts > 0
        c[filled] = (onehot[filled] @ x) / counts[filled, None]
        new = ((c * c).sum(axis=1)[None, :] - 2.0 * (x @ c.T)).argmin(axis=1)
        if np.array_equal(new, labels):
            break
        labels = new
    return labels, c.astype(np.float32)


@dataclass
class Recollected:
    """The truncated union of Algorithm 3: row indices, their scores, and the work done."""

    idx: np.ndarray
    scores: np.ndarray
    rounds: int
    queries: int
    exact_rows: int = 0


def exact_top_n(z: np.ndarray, x: np.ndarray, upper: np.ndarray, n: int,
                bias: np.ndarray | float = 0.0) -> tuple[np.ndarray, np.ndarray, int]:
    """The exact top-n rows of z·x + bias, scoring only rows whose upper bound can still win.

    `upper[i] ≥ z_i·x` for every row. Rows are scored in decreasing bound order until the n-th
    best exact score beats every remaining bound (threshold algorithm), so the result equals a
    full scan while reading a small part of z. Returns (rows, exact scores, rows scored).
    """
    m = z.shape[0]
    ub = upper + bias
    take = min(m, max(4 * n, 64))
    while True:
        cand = top_k(ub, take)
        exact = z[cand] @ x + (bias[cand] if isinstance(bias, np.ndarray) else bias)
        best = top_k(exact, n)
        if take >= m or exact[best[-1]] >= ub[cand[-1]]:
            return cand[best], exact[best], take
        take = min(m, take * 4)


class _TailMiss(Exception):
    """A row outside the head might enter a round's top-N: redo the search over every row."""


def recollection(
    x_t: np.ndarray, z: np.ndarray, k: int, *, beam: int = 3, fanout: int = 2, rounds: int = 3,
    alpha: float = 0.5, prior: np.ndarray | None = None, probe_scores: np.ndarray | None = None,
    kmeans_iters: int = 10, head: int = 256, early_stop: bool = True,
) -> Recollected:
    """Algorithm 3: retrieve → KMeans(B) → α-mix with the residual query → beam of B, R rounds.

    Round 0 ranks by the probe scores (z·x_t, reused from the probe when given). Each later
    top-N, for a recollect query x_b = norm(α x + (1−α) g_b + x_t), is exact but pruned: since
    z·x_b ≤ (α·ub(z·x) + (1−α)·ub(z·g_b) + z·x_t) / ‖·‖ with a spherical bound on z·g_b, only rows
    whose bound can still win are multiplied (`exact_top_n`). The search runs on the `head`
    rows best by the probe; the rows outside it share one scalar bound, checked every round, and
    if that bound could let one of them in, the whole search is redone over every row. Either
    way the result is the one a full scan per round gives (tests compare both).
    `early_stop=False` runs all R rounds (the paper's full-exploration study, Appendix D.9).
    """
    m = z.shape[0]
    if m == 0 or k <= 0:
        return Recollected(np.zeros(0, np.int64), np.zeros(0, np.float32), 0, 0)
    bias = prior if prior is not None else np.zeros(m, dtype=np.float32)
    x0 = _norm(np.asarray(x_t, dtype=np.float32))
    s_t = probe_scores if probe_scores is not None else z @ x0
    if head < m:
        rows = top_k(s_t + bias, head)
        rest = np.ones(m, dtype=bool)
        rest[rows] = False
        tail = (s_t[rest], bias[rest])
        try:
            res = _recollect(x0, z[rows], s_t[rows], bias[rows], tail, k, beam, fanout, rounds, alpha,
                             kmeans_iters, early_stop)
            res.idx = rows[res.idx]
            return res
        except _TailMiss:
            log.debug("recollection left its head of %d rows: full search", head)
    return _recollect(x0, z, s_t, bias, None, k, beam, fanout, rounds, alpha, kmeans_iters, early_stop)


def _recollect(x0: np.ndarray, z: np.ndarray, s_t: np.ndarray, bias: np.ndarray,
               tail: tuple[np.ndarray, np.ndarray] | None, k: int, beam: int, fanout: int, rounds: int,
               alpha: float, kmeans_iters: int, early_stop: bool = True) -> Recollected:
    """Algorithm 3 over the rows of z; `tail` = (z·x_t, bias) of the rows left out, which are
    only bounded, never multiplied."""
    m = z.shape[0]
    theta_t = np.arccos(np.clip(s_t, -1.0, 1.0))  # angles to x_t, for the bounds on z·g_b
    s_tail = tail[0] if tail else np.zeros(0, np.float32)
    theta_tail = float(np.arccos(np.clip(s_tail.max(), -1.0, 1.0))) if s_tail.size else 0.0
    # beam entries: (query, bound of z·query per row, the same bound for every tail row)
    beam_q: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = [(x0, s_t, s_tail)]
    bag: dict[int, float] = {}
    n_queries, r_done, scored = 0, 0, 0
    for r in range(rounds):
        n = min((beam + r) * fanout, m)
        r_done = r + 1
        cands: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, float]] = []
        for x, ub_x, ubt_x in beam_q:
            if r == 0:
                c = top_k(s_t + bias, n)
            else:
                c, sc, used = exact_top_n(z, x, ub_x, n, bias)
                n_queries += 1
                scored += used
                if tail is not None and (c.size < n or sc[-1] < float((ubt_x + tail[1]).max())):
                    raise _TailMiss()
            if c.size == 0:
                continue
            labels, centers = kmeans(z[c], min(beam, c.size), kmeans_iters)
            for b in np.unique(labels):
                g_rows = c[labels == b]
                g = _norm(centers[b])
                raw = alpha * x + (1.0 - alpha) * g + x0
                norm = max(float(np.linalg.norm(raw)), 1e-12)
                cands.append((raw / norm, g_rows, ub_x, ubt_x, float(x0 @ g), norm))
        if not cands:
            break
        # score each branch by Σ_{i∈G} <x_b, z_i>; keep the top-B as the new beam
        branch_scores = np.array([float((z[c[1]] @ c[0]).sum()) for c in cands])
        keep = top_k(branch_scores, beam)
        beam_q = []
        for bi in keep:
            xb, g_rows, ub_x, ubt_x, cos_tg, norm = cands[int(bi)]
            member_scores = z[g_rows] @ xb
            for i, sc_i in zip(g_rows.tolist(), member_scores.tolist()):
                if i not in bag:
                    bag[i] = sc_i + float(bias[i])
            # bound of z·x_b: ∠(z, g) ≥ |∠(z, x_t) − ∠(x_t, g)| on the unit sphere
            theta_tg = float(np.arccos(min(1.0, max(-1.0, cos_tg))))
            ub_g = np.cos(np.abs(theta_t - theta_tg))
            ub_b = (alpha * ub_x + (1.0 - alpha) * ub_g + s_t) / norm + 1e-5
            ubt_g = float(np.cos(theta_tail - theta_tg)) if theta_tg < theta_tail else 1.0
            ubt_b = (alpha * ubt_x + ((1.0 - alpha) * ubt_g) + s_tail) / norm + 1e-5
            beam_q.append((xb, ub_b, ubt_b))
        if early_stop and len(bag) >= k:
            break
    idx = np.fromiter(bag.keys(), dtype=np.int64, count=len(bag))
    sc_all = np.fromiter(bag.values(), dtype=np.float32, count=len(bag))
    order = top_k(sc_all, k if early_stop else len(bag))
    return Recollected(idx[order], sc_all[order], r_done, n_queries, scored)
