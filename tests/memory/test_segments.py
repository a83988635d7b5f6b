"""Breakpoint segmentation shared by the rules topics and MemWeaver phases (expected ranges were
computed with the two implementations it replaced)."""
from __future__ import annotations

import numpy as np

from memory.llm.rules import topic_segments
from memory.segments import breakpoints
from memory.stages.summarize import segment

SIMS = [0.9, 0.9, 0.2, 0.9, 0.9, 0.9, 0.1, 0.9, 0.9, 0.3, 0.25, 0.9]


def test_cuts_at_deep_drops_keeping_the_minimum_size() -> None:
    cut = float(np.mean(SIMS) - 0.5 * np.std(SIMS))
    assert breakpoints(SIMS, cut, 3, 10) == [(0, 3), (3, 7), (7, 10), (10, 13)]
    assert topic_segments(SIMS, 13) == [(0, 3), (3, 7), (7, 10), (10, 13)]
    # 0.3 is no local minimum, and a cut at 0.25 would leave a 2-item segment
    assert breakpoints(SIMS, cut, 3, 10, local_minima=True) == [(0, 3), (3, 7), (7, 13)]


def test_long_flat_runs_are_split_and_short_ones_kept_whole() -> None:
    assert topic_segments([0.8] * 20, 21) == [(0, 3), (3, 6), (6, 9), (9, 12), (12, 21)]
    assert topic_segments([0.1, 0.9, 0.1, 0.9], 5) == [(0, 5)]
    assert topic_segments([], 0) == [] and topic_segments([0.5], 5) == [(0, 5)]   # sims of the wrong length


def test_phases_follow_a_change_of_subject() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(16), rng.standard_normal(16)
    vecs = np.stack([a + 0.1 * rng.standard_normal(16) for _ in range(12)]
                    + [b + 0.1 * rng.standard_normal(16) for _ in range(12)])
    assert segment(vecs, min_size=4, max_size=20) == [(0, 12), (12, 24)]
    assert segment(vecs[:5], min_size=4) == [(0, 5)] and segment(vecs[:0]) == []


def test_topic_threshold_ties_keep_the_plain_float_statistics() -> None:
    """With 80 % of the links at one value the threshold equals that value in exact arithmetic; the
    old `topic_segments` decided the tie with Python float sums, which NumPy's pairwise sums do not
    reproduce in the last bit (expected ranges from the implementation before `memory.segments`)."""
    assert topic_segments([0.1] * 8 + [0.3] * 2, 11) == [(0, 3), (3, 11)]
    assert topic_segments([0.2, 0.2, 0.3, 0.2, 0.2, 0.2, 0.2, 0.3, 0.2, 0.2], 11) == [(0, 4), (4, 11)]
