"""Per-user gate thresholds from the user's own score distribution (instead of constants).

The paper's θ_high = 0.6, θ_low = 0.3, τ were set by hand for one embedder and one memory
granularity (Appendix B); Appendix D.10 shows the routing shifts with the embedder, and similarity
levels differ between turns, fragments and insights. We probe the user's memory with a sample of
its own rows as pseudo-queries (each row's own score left out), compute (s̄, H) of every probe as
the gate would, and place θ_high, θ_low and τ at quantiles of those distributions
(`calib_high_q`, `calib_low_q`, `calib_tau_q`). Memory-to-memory probes can score higher than real
questions do; `calib_shift` (default 0) is subtracted from the probe means to allow for that gap. One (S × M) matrix product; S = `calibration_samples`.
"""
from __future__ import annotations

import logging

import numpy as np

from retrieval import rfmem
from memory.settings import RetrievalSettings

log = logging.getLogger(__name__)


def probe_stats(z: np.ndarray, samples: int, probe_k: int, lam: float, normalized: bool) -> np.ndarray:
    """(s̄, H) of `samples` rows of z used as queries against z without themselves, shape (S, 2)."""
    m = z.shape[0]
    if m < 3:
        return np.zeros((0, 2))
    pick = np.unique(np.linspace(0, m - 1, num=min(samples, m)).astype(np.int64))
    sims = z[pick] @ z.T
    sims[np.arange(pick.size), pick] = -np.inf
    k = min(probe_k, m - 1)
    top = np.partition(sims, m - k, axis=1)[:, m - k:]
    return np.array([rfmem.familiarity_signal(row, lam, normalized) for row in top])


def calibrate(z: np.ndarray, s: RetrievalSettings) -> dict[str, float]:
    """θ_high, θ_low and τ for this memory matrix; the paper's constants when it is too small."""
    stats = probe_stats(z, s.calibration_samples, s.probe_k, s.lam, s.entropy_normalized)
    if stats.shape[0] < 8:
        return {"theta_high": s.theta_high, "theta_low": s.theta_low, "tau": s.tau, "samples": 0}
    means = stats[:, 0] - s.calib_shift
    out = {
        "theta_high": float(np.quantile(means, s.calib_high_q)),
        "theta_low": float(np.quantile(means, s.calib_low_q)),
        "tau": float(np.quantile(stats[:, 1], s.calib_tau_q)),
        "samples": int(stats.shape[0]),
    }
    log.debug("calibrated gate: %s", out)
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}
