"""Turn pooling (`RetrievalSettings.turn_pool_gamma`, `strategies.pool_turns`): a turn is ranked once
with the single-source memories citing it, its best member's margin discounted by n^-γ."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from memory.settings import RetrievalSettings
from retrieval.index import META, UserIndex
from retrieval.strategies import STRATEGIES, Query, pool_turns, turn_groups


def _unit(cos: float, j: int) -> np.ndarray:
    """A unit vector of cosine `cos` with e0, its rest along axis j (1..3)."""
    v = np.zeros(4, np.float32)
    v[0], v[j] = cos, np.sqrt(1 - cos * cos)
    return v


def _index() -> UserIndex:
    """Turn a (cos 0.5) with 9 fragments, one of them at 0.8; turn b (0.7) with one fragment at 0.65;
    an insight citing both turns (0.6); a fragment of a turn that is not indexed (0.3)."""
    rows = [("a", "message", ["a"], 0.5), ("b", "message", ["b"], 0.7)]
    rows += [(f"fa{i}", "fragment", ["a"], 0.8 if i == 0 else 0.2) for i in range(9)]
    rows += [("fb", "fragment", ["b"], 0.65), ("i", "insight", ["a", "b"], 0.6), ("fc", "fragment", ["c"], 0.3)]
    n = len(rows)
    meta = pa.table({"id": [r[0] for r in rows], "kind": [r[1] for r in rows], "text": [r[0] for r in rows],
                     "key": [None] * n, "date": [None] * n, "source_ids": [r[2] for r in rows],
                     "ts": pa.nulls(n, pa.timestamp("us", tz="UTC"))}, schema=META)
    z = np.stack([_unit(r[3], 1 + i % 3) for i, r in enumerate(rows)])
    return UserIndex(user_id="u", z=z, meta=meta, kinds=np.asarray([r[1] for r in rows]), messages=pa.table({}))


def _query(idx: UserIndex, gamma: float, k: int = 10) -> Query:
    s = RetrievalSettings(turn_pool_gamma=gamma, lexical_weight=0.0)
    return Query(idx, np.eye(4, dtype=np.float32)[0], None, k, s, s.kinds)


def test_groups_join_single_source_memories_to_their_indexed_turn() -> None:
    idx = _index()
    g = turn_groups(idx)
    ids = idx.meta.column("id").to_pylist()
    assert [g[ids.index(x)] for x in ("a", "fa0", "fa8", "b", "fb")] == [0, 0, 0, 1, 1]
    assert g[ids.index("i")] == ids.index("i") and g[ids.index("fc")] == ids.index("fc")


@pytest.mark.parametrize("gamma", [0.3, 0.5, 1.0])
def test_pooled_score_is_the_turn_plus_the_discounted_margin(gamma: float) -> None:
    idx = _index()
    q = _query(idx, gamma)
    rows = np.arange(idx.size)
    scores = (idx.z @ q.vector).astype(np.float32)
    kept, pooled = pool_turns(q, rows, scores)
    ids = idx.meta.column("id").take(pa.array(kept)).to_pylist()
    assert sorted(ids) == ["b", "fa0", "fc", "i"]              # one row per turn: its best-scored member
    got = dict(zip(ids, pooled.tolist()))
    assert got["fa0"] == pytest.approx(0.5 + 9 ** -gamma * 0.3, abs=1e-5)
    assert got["b"] == pytest.approx(0.7, abs=1e-5)           # no member beats the turn
    assert got["i"] == pytest.approx(0.6, abs=1e-5) and got["fc"] == pytest.approx(0.3, abs=1e-5)
    assert q.signals["turn_pooled"] == idx.size - 4


def test_gamma_zero_leaves_the_ranking_as_it_was() -> None:
    idx = _index()
    q = _query(idx, 0.0)
    rows = np.arange(idx.size)
    scores = (idx.z @ q.vector).astype(np.float32)
    kept, pooled = pool_turns(q, rows, scores)
    assert kept is rows and pooled is scores


@pytest.mark.parametrize("strategy", ["hybrid", "rfmem-hybrid"])
def test_a_turn_with_many_fragments_no_longer_wins_on_one_lucky_fragment(strategy: str) -> None:
    idx = _index()
    first = lambda gamma: idx.meta.column("source_ids")[int(STRATEGIES[strategy](_query(idx, gamma, k=1))[0][0])]
    assert first(0.0).as_py() == ["a"]          # the max: a's one fragment at 0.8
    assert first(0.5).as_py() == ["b"]          # pooled: a = 0.5 + 0.3 / 3 = 0.6 < b = 0.7
