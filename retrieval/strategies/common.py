"""What every strategy shares: the `Query` it gets, the row subsets and rankings it cuts, source
deduplication, RF-Mem's familiarity signal and gate thresholds, and where the user's profile sits.

A strategy is `Callable[[Query], Result]`: it returns ranked index rows, their scores and the route
taken (`rfmem.FAMILIARITY` / `rfmem.RECOLLECTION`), and records what it measured in `Query.signals`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memory.read import PROFILE_KEY
from memory.settings import RetrievalSettings
from retrieval import rfmem
from retrieval.calibration import calibrate
from retrieval.index import UserIndex
from retrieval.lexical import QUESTION_WORDS, normalized
from retrieval.recall_cue import asks_what_i_said, asks_what_you_said, assistant_turns


@dataclass
class Query:
    """One retrieval as a strategy sees it: the user index, the query vector and text, k, the
    settings and the searched kinds; the strategy records what it measured in `signals`."""

    index: UserIndex
    vector: np.ndarray
    text: str | None
    k: int
    settings: RetrievalSettings
    kinds: tuple[str, ...]
    signals: dict[str, Any] = field(default_factory=dict)
    #: set by `novel`: the ranking skipped memories adding no new source, and a reranker keeps that
    deduped: bool = False

    def rows(self, kinds: tuple[str, ...] | None = None) -> np.ndarray:
        """Row numbers of the searched kinds (all rows when every kind is searched), without the
        memories derived from assistant turns only (`assistant_memories`)."""
        wanted = tuple(sorted(kinds or self.kinds))
        voices = tuple(sorted(self.settings.assistant_speakers))

        def build() -> np.ndarray:
            keep = np.isin(self.index.kinds, wanted)
            if voices:
                keep &= ~assistant_memories(self.index, voices)
            return np.flatnonzero(keep)
        return self.index.memo("rows:" + ",".join(wanted) + "|" + ",".join(voices), build)

    def prior(self, rows: np.ndarray, z_scores: np.ndarray) -> np.ndarray:
        """Kind weights plus the weighted, max-normalized BM25 score of each row, and the assistant's
        turns' `recall_boost` when the query asks what the assistant said, or minus `own_words_penalty`
        when it asks what the user said (`recall_cue`)."""
        s = self.settings
        weights = self.index.memo("kindw:" + repr(sorted(s.kind_weights.items())), lambda: _kind_weights(
            self.index.kinds, s.kind_weights))
        out = weights[rows].copy()
        if self.text and s.lexical_weight > 0:
            bm = self.index.lexical(s.bm25_k1, s.bm25_b).scores(self.text, QUESTION_WORDS)[rows]
            out += s.lexical_weight * normalized(bm)
            self.signals["lexical_hits"] = int((bm > 0).sum())
        if s.assistant_speakers and (s.recall_boost or s.own_words_penalty):
            you = asks_what_you_said(self.text)    # about the assistant's words: never the user's too
            shift = s.recall_boost if you else -s.own_words_penalty if asks_what_i_said(self.text) else 0.0
            if shift:
                theirs = assistant_turns(self.index, tuple(s.assistant_speakers))[rows]
                out[theirs] += shift
                self.signals["recall_boosted" if you else "own_words"] = int(theirs.sum())
        return out


#: (ranked index rows, their scores, the route taken)
Result = tuple[np.ndarray, np.ndarray, str | None]


def _kind_weights(kinds: np.ndarray, weights: dict[str, float]) -> np.ndarray:
    """The prior weight of every row from its kind, vectorized (one mask per kind)."""
    out = np.zeros(kinds.shape[0], dtype=np.float32)
    for kind, w in weights.items():
        if w:
            out[kinds == kind] = w
    return out


def assistant_memories(index: UserIndex, voices: tuple[str, ...]) -> np.ndarray:
    """Per index row: is it a memory (not a raw turn) whose every source turn was said by one of
    `voices` (speaker names, case-insensitive)? Memory is about the user (PREMem extracts personal
    information): an assistant's long replies become dozens of fragments and topics paraphrasing
    its own advice, which crowd the top-K and each cite the same turn; the turns themselves stay
    searchable. Sources that are not stored turns never count as the assistant's."""
    def build() -> np.ndarray:
        t = index.messages
        if t.num_rows == 0 or "speaker" not in t.column_names or index.size == 0:
            return np.zeros(index.size, dtype=bool)
        theirs = index.said_ids(voices)
        lists = index.meta.column("source_ids").combine_chunks()
        lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False)
        flat = pc.list_flatten(lists)        # the sources of every row, in row order
        hit = pc.fill_null(pc.is_in(flat, value_set=theirs), False)
        hit_n = hit.to_numpy(zero_copy_only=False).astype(np.int64)
        owner = np.repeat(np.arange(index.size), lengths)
        theirs_n = np.bincount(owner, weights=hit_n, minlength=index.size)
        return (lengths > 0) & (theirs_n == lengths) & (index.kinds != "message")
    return index.memo("assistant-memories:" + ",".join(voices), build)


def subset(q: Query, kinds: tuple[str, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(index rows of the searched kinds, their vectors), the vectors cached with the index."""
    rows = q.rows(kinds)
    z = q.index.z if rows.size == q.index.size else q.index.memo(
        "z:" + ",".join(sorted(kinds or q.kinds)) + "|" + ",".join(sorted(q.settings.assistant_speakers)),
        lambda: np.ascontiguousarray(q.index.z[rows]))
    return rows, z


#: a deduplicating ranking looks at k × this many candidates before skipping the covered ones
DEDUPE_POOL = 4


def novel_order(sources: Sequence[list[str] | None], order: np.ndarray, k: int) -> np.ndarray:
    """The first k positions of `order` whose item cites a source no earlier kept item cites (items
    without sources are kept): `novel` for a reordered candidate list."""
    seen: set[str] = set()
    keep = []
    for i in order.tolist():
        new = set(sources[i] or []) - seen
        if new or not sources[i]:
            keep.append(i)
            seen |= new
            if len(keep) == k:
                break
    return np.asarray(keep, dtype=np.int64)


def novel(q: Query, rows: np.ndarray, scores: np.ndarray, route: str | None) -> Result:
    """Keep ranked rows that cite at least one message not cited above them, up to k: a memory
    whose every source is already covered adds no new evidence (e.g. a fragment below its turn)."""
    sources = q.index.meta.column("source_ids").take(rows).to_pylist()
    idx = novel_order(sources, np.arange(len(sources)), q.k)
    q.deduped = True
    q.signals["skipped_redundant"] = int(len(rows) - idx.size) if idx.size < q.k else 0
    return rows[idx], scores[idx], route


def turn_groups(index: UserIndex) -> np.ndarray:
    """Per index row, its turn group: the row of the turn that a single-source memory cites (when the
    turn is indexed), else the row itself (turns, memories citing several turns or an unindexed one)."""
    def build() -> np.ndarray:
        group = np.arange(index.size, dtype=np.int64)
        sources = index.meta.column("source_ids").to_pylist()
        turn_row = index.turn_rows()
        for i, s in enumerate(sources):
            if s and len(s) == 1 and index.kinds[i] != "message":
                group[i] = turn_row.get(s[0], i)
        return group
    return index.memo("turn-groups", build)


def _turn_layout(index: UserIndex, rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """`rows` laid out by turn group: (permutation, segment starts, segment of each permuted row,
    whether each permuted row is its group's turn)."""
    group = turn_groups(index)[rows]
    perm = np.argsort(group, kind="stable")
    g = group[perm]
    head = np.r_[True, g[1:] != g[:-1]]
    return perm, np.flatnonzero(head), np.cumsum(head) - 1, (group == rows)[perm]


def pool_turns(q: Query, rows: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rank each turn once with the single-source memories citing it (its fragments, one-turn
    topics), when `settings.turn_pool_gamma` > 0: the group scores s_turn + w·max(0, best − s_turn)
    with w = n^−γ for its n member memories among `rows` (a turn with many fragments has many chances
    of one matching by accident; one fragment keeps the plain max); a group whose turn is not among
    `rows` scores its best member. One row per group is kept (its best-scored one), with the group's
    score, in row order. γ = 0: `rows` and `scores` unchanged (the plain max of `novel`)."""
    gamma = q.settings.turn_pool_gamma
    if gamma <= 0 or rows.size == 0:
        return rows, scores
    if rows is q.rows():                                       # the searched rows: the layout is cached
        layout = q.index.memo("turn-layout:" + ",".join(sorted(q.kinds)) + "|"
                              + ",".join(sorted(q.settings.assistant_speakers)), lambda: _turn_layout(q.index, rows))
    else:
        layout = _turn_layout(q.index, rows)
    perm, starts, seg, is_turn = layout
    sc = scores[perm].astype(np.float64)
    members = np.where(is_turn, -np.inf, sc)
    best = np.maximum.reduceat(members, starts)
    n = np.add.reduceat((~is_turn).astype(np.int64), starts)
    turn = np.full(starts.size, np.nan)
    turn[seg[is_turn]] = sc[is_turn]
    w = np.maximum(n, 1).astype(np.float64) ** -gamma
    pooled = np.where(np.isnan(turn), best,
                      np.where(n == 0, turn, turn + w * np.maximum(0.0, best - np.nan_to_num(turn))))
    top_hit = np.flatnonzero(sc == np.maximum.reduceat(sc, starts)[seg])   # each group's best row(s)
    first = top_hit[np.r_[True, seg[top_hit][1:] != seg[top_hit][:-1]]]
    keep = perm[first]
    order = np.argsort(keep)
    q.signals["turn_pooled"] = int(rows.size - keep.size)
    return rows[keep[order]], pooled[seg[first]][order].astype(np.float32)


def top(q: Query, rows: np.ndarray, ranked: np.ndarray, route: str | None, dedupe: bool) -> Result:
    """The best k rows by `ranked`; with `dedupe` the novel ones among the best k × DEDUPE_POOL
    (turns pooled with their memories first, see `pool_turns`)."""
    if dedupe:
        rows, ranked = pool_turns(q, rows, ranked)
    best = rfmem.top_k(ranked, q.k * DEDUPE_POOL if dedupe else q.k)
    if dedupe:
        return novel(q, rows[best], ranked[best], route)
    return rows[best], ranked[best], route


def familiarity_signal(q: Query, probe: np.ndarray) -> tuple[float, float]:
    """RF-Mem's (mean, entropy) of the probe's top `probe_k` scores, recorded in the signals."""
    s = q.settings
    best = rfmem.top_k(probe, s.probe_k)
    mean, ent = rfmem.familiarity_signal(probe[best], s.lam, s.entropy_normalized)
    q.signals.update(probe_mean=round(mean, 4), entropy=round(ent, 4))
    return mean, ent


def thresholds(q: Query, calibrated: bool) -> tuple[float, float, float]:
    """The gate's (θ_high, θ_low, τ): the settings', or calibrated on this user's memory (cached
    with the index, recorded in `signals["calibration"]`)."""
    s = q.settings
    if not calibrated:
        return s.theta_high, s.theta_low, s.tau
    rows, z = subset(q)
    key = f"calib:{','.join(sorted(q.kinds))}|{','.join(sorted(s.assistant_speakers))}"
    cal = q.index.memo(f"{key}:{s.probe_k}:{s.lam}:{s.entropy_normalized}",
                       lambda: calibrate(z, s))
    q.signals["calibration"] = cal
    return cal["theta_high"], cal["theta_low"], cal["tau"]


def profile_row(index: UserIndex) -> int | None:
    """Row of the user's MemWeaver profile in the index, if it has one."""
    summary = np.flatnonzero(index.kinds == "summary")
    if summary.size == 0:
        return None
    keys = index.meta.column("key").take(pa.array(summary)).to_pylist()
    hits = [int(row) for row, key in zip(summary, keys) if key == PROFILE_KEY]
    return hits[0] if hits else None
