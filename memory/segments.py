"""Cutting a sequence into segments where the similarity between neighbours drops.

One algorithm serves the `rules` topic segmentation (RMM D.1.1 stand-in, over adjacent turns) and
MemWeaver's phases (`summarize`, over windowed gaps between fragments): cut at the gaps whose
similarity lies below a threshold (each caller's mean minus some standard deviations), deepest first, while every segment keeps
at least `min_size` items; then split any segment longer than `max_size` at its deepest admissible
gap. Written here because the text-tiling packages on PyPI segment text, not vectors, and would
not keep both callers' rules.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def breakpoints(sims: Sequence[float] | np.ndarray, threshold: float, min_size: int, max_size: int,
                local_minima: bool = False) -> list[tuple[int, int]]:
    """[start, end) ranges over n = len(sims) + 1 items; sims[g-1] is the similarity across gap g
    (between items g-1 and g), and gaps below `threshold` are cut candidates. The caller computes
    the threshold, because the last bit of it decides ties and each caller keeps its own arithmetic.
    With `local_minima` only gaps no higher than their neighbours are candidates. `max_size` is
    raised to 2·`min_size` when below it, so a long segment can always be split."""
    s = np.asarray(sims, dtype=np.float64)
    n = len(s) + 1
    max_size = max(max_size, 2 * min_size)
    if n < 2 * min_size:
        return [(0, n)]
    cuts: list[int] = []

    def admissible(g: int) -> bool:
        prev = max([c for c in cuts if c < g], default=0)
        nxt = min([c for c in cuts if c > g], default=n)
        return g - prev >= min_size and nxt - g >= min_size

    for i in np.argsort(s, kind="stable").tolist():
        g = i + 1
        if s[i] >= threshold:
            break
        if local_minima and ((i > 0 and s[i] > s[i - 1]) or (i + 1 < len(s) and s[i] > s[i + 1])):
            continue
        if admissible(g):
            cuts.append(g)
    while True:
        bounds = [0] + sorted(cuts) + [n]
        long = [(a, b) for a, b in zip(bounds, bounds[1:]) if b - a > max_size]
        if not long:
            return list(zip(bounds, bounds[1:]))
        a, b = long[0]
        gaps = np.arange(a + min_size, b - min_size + 1)
        cuts.append(int(gaps[int(np.argmin(s[gaps - 1]))]))
