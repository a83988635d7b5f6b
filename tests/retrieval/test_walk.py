"""MemWeaver random walk (retrieval/walk.py, retrieval/strategies/walk.py): Eq. 2 transition
probabilities in days, temporal-only neighbours by default, determinism per query, unique visited
nodes, the merge (walked nodes boost the raw turns they cite), the walk strategies on a consolidated
store and without a graph."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from memory.store import Store
from retrieval import RetrievalSettings, Retriever
from retrieval.walk import Graph, WalkParams, node_weights, transitions, walk, walk_rng


def _graph() -> Graph:
    """5 nodes on days 0, 0, 10, 30, 100; clusters {0, 2, 4} and {1, 3}; chain 0-1-2-3-4."""
    days = np.array([0.0, 0.0, 10.0, 30.0, 100.0])
    cluster = np.array([0, 1, 0, 1, 0])
    temporal: list[list[tuple[int, float]]] = [[] for _ in range(5)]
    for a in range(4):
        gap = days[a + 1] - days[a]
        temporal[a].append((a + 1, gap))
        temporal[a + 1].append((a, gap))
    return Graph(np.arange(5), days, cluster, [np.flatnonzero(cluster == c) for c in (0, 1)], temporal)


def test_transition_follows_eq_2_in_days() -> None:
    g, p = _graph(), WalkParams(cluster=True)
    sims = np.array([0.9, 0.5, 0.8, -0.2, 0.6])
    base = node_weights(g, sims, p)  # query time = the latest node (day 100)
    nb, prob = transitions(g, 0, base, p)
    assert sorted(nb.tolist()) == [1, 2, 4]  # temporal neighbour 1, cluster mates 2 and 4
    want = {v: max(sims[v], 0) ** 1.5 * np.exp(-0.01 * (100 - g.days[v])) * np.exp(-0.02 * abs(g.days[v] - 0))
            for v in (1, 2, 4)}
    total = sum(want.values())
    for v, pv in zip(nb.tolist(), prob.tolist()):
        assert pv == pytest.approx(want[v] / total)
    nb3, prob3 = transitions(g, 3, base, p)
    assert 3 not in nb3.tolist() and prob3.sum() == pytest.approx(1.0)
    # a negative cosine is never a destination
    assert all(pv == 0 for v, pv in zip(*transitions(g, 2, base, p)) if v == 3)


def test_default_neighbours_are_the_temporal_edges() -> None:
    """Without `cluster` a node's neighbours are its temporal neighbours, weighted by Eq. 2."""
    g = _graph()
    p = WalkParams()
    assert p.cluster is False
    sims = np.array([0.9, 0.5, 0.8, 0.4, 0.6])
    base = node_weights(g, sims, p)
    for u in range(5):
        nb, prob = transitions(g, u, base, p)
        assert sorted(nb.tolist()) == sorted(v for v in (u - 1, u + 1) if 0 <= v < 5)
        assert prob.sum() == pytest.approx(1.0)
    nb, prob = transitions(g, 2, base, p)  # from day 10: node 1 (day 0) vs node 3 (day 30)
    want = {v: sims[v] ** 1.5 * np.exp(-0.01 * (100 - g.days[v])) * np.exp(-0.02 * abs(g.days[v] - 10))
            for v in (1, 3)}
    for v, pv in zip(nb.tolist(), prob.tolist()):
        assert pv == pytest.approx(want[v] / sum(want.values()))
    assert sorted(g.neighbours(0, cluster=True)[0].tolist()) == [1, 2, 4]


def test_walk_is_deterministic_per_query_and_unique() -> None:
    g = _graph()
    sims = np.array([0.9, 0.5, 0.8, 0.3, 0.6])
    q = np.ones(8, np.float32)
    a = walk(g, sims, [0, 2], walk_rng("u", q))
    b = walk(g, sims, [0, 2], walk_rng("u", q))
    assert a.nodes == b.nodes and a.visits == b.visits
    assert len(a.nodes) == len(set(a.nodes)) and a.nodes[0] == 0
    # 2 seeds × 5 walks × 10 steps; every walk start counts as a visit of its seed
    assert a.steps == 100 and sum(a.visits.values()) == 110
    ranked = a.ranked()
    assert sorted(ranked) == sorted(a.nodes)
    assert [a.visits[n] for n in ranked] == sorted(a.visits.values(), reverse=True)
    one = walk(g, sims, [0, 2], walk_rng("u", q), WalkParams(walks=1, restart=0.0, cluster=True))
    assert one.steps == 20 and sum(one.visits.values()) == 22
    assert walk(g, sims, [], walk_rng("u", q)).nodes == []


def test_walk_reach_is_the_best_eq_2_score_and_restarts_stay_deterministic() -> None:
    g, p = _graph(), WalkParams(walks=3, restart=0.5)
    sims = np.array([0.9, 0.5, 0.8, 0.3, 0.6])
    q = np.ones(8, np.float32)
    a = walk(g, sims, [0], walk_rng("u", q), p)
    assert a.nodes == walk(g, sims, [0], walk_rng("u", q), p).nodes
    assert a.steps == 30 and sum(a.visits.values()) == 33 and 0 not in a.reach
    base = node_weights(g, sims, p)
    for v, s in a.reach.items():  # S(u→v) of some u that has v as a neighbour
        best = max(base[v] * np.exp(-0.02 * abs(g.days[v] - g.days[u])) for u in range(5)
                   if v in transitions(g, u, base, p)[0].tolist())
        assert 0 < s <= best + 1e-12


@pytest.fixture(scope="module")
def retriever(module_sample_store: Store) -> Retriever:
    """One retriever (one warm index per user) over this module's copy of the consolidated sample."""
    return Retriever(module_sample_store, RetrievalSettings(refresh_ms=0))


@pytest.mark.parametrize("strategy", ["walk", "hybrid-walk", "rfmem-walk", "rfmem-hybrid-walk"])
def test_walk_strategies_on_a_store(retriever: Retriever, strategy: str) -> None:
    from retrieval.context import is_profile

    r = retriever
    user = r.store.users()[0]
    res = r.retrieve(user, "what did they do on the weekend?", k=5, strategy=strategy)
    ranked = [it for it in res.items if not is_profile(it)]
    assert 0 < len(ranked) <= 5 and len({it.id for it in ranked}) == len(ranked)
    again = r.retrieve(user, "what did they do on the weekend?", k=5, strategy=strategy)
    assert [it.id for it in again.items] == [it.id for it in res.items]
    if strategy in ("walk", "hybrid-walk"):
        assert res.route == "recollection" and res.signals["walk_visited"] >= 1
        assert res.signals["walk_steps"] > 0
    elif res.route == "familiarity":
        assert "walk_visited" not in res.signals, "the gate chose familiarity, yet a walk is reported"


@pytest.mark.parametrize("strategy", ["rfmem-walk", "rfmem-hybrid-walk"])
def test_gated_walk_strategies_walk_when_the_gate_recollects(module_sample_store: Store, strategy: str) -> None:
    """With θ_low above any cosine the gate always recollects, and recollection is the walk."""
    r = Retriever(module_sample_store, RetrievalSettings(refresh_ms=0, theta_high=1.5, theta_low=1.2))
    user = r.store.users()[0]
    res = r.retrieve(user, "what did they do on the weekend?", k=5, strategy=strategy)
    assert res.route == "recollection"
    assert res.signals["walk_visited"] >= 1 and res.signals["walk_steps"] > 0


def test_walk_without_graph_falls_back(sample_store: Store) -> None:
    from retrieval.walk import graph_for

    st = sample_store  # a private copy of the consolidated sample
    st.drop_table("graph_nodes")
    r = Retriever(st, RetrievalSettings(refresh_ms=0))
    user = st.users()[0]
    assert graph_for(r.user_index(user)).size == 0
    res = r.retrieve(user, "weekend", k=3, strategy="walk")
    assert res.items and res.route == "recollection"


def test_days_between_sessions() -> None:
    from memory.graph import days

    t = datetime(2023, 5, 1, tzinfo=timezone.utc)
    assert days(t, t + timedelta(hours=36)) == pytest.approx(1.5)


def test_hybrid_walk_is_hybrid_plus_the_walk_bonus(retriever: Retriever, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a bonus, `hybrid-walk` ranks exactly as `hybrid`; with one, no row gains more than it."""
    from retrieval.strategies import walk as walk_mod

    r = retriever
    user = r.store.users()[0]
    text = "what did they do on the weekend?"
    hyb = r.retrieve(user, text, k=5, strategy="hybrid")
    monkeypatch.setitem(walk_mod.MERGE, "bonus", 0.0)
    flat = r.retrieve(user, text, k=5, strategy="hybrid-walk")
    assert [it.id for it in flat.items] == [it.id for it in hyb.items]
    assert flat.route == "recollection" and flat.signals["walk_steps"] > 0
    monkeypatch.undo()
    bonus = walk_mod.MERGE["bonus"]
    walked = r.retrieve(user, text, k=5, strategy="hybrid-walk")
    base = {it.id: it.score for it in hyb.items}
    for it in walked.items:
        if it.id in base:
            assert base[it.id] - 1e-6 <= it.score <= base[it.id] + bonus + 1e-6


def test_graph_cites_the_raw_turns_of_each_node(retriever: Retriever) -> None:
    from retrieval.walk import graph_for

    idx = retriever.user_index(retriever.store.users()[0])
    g = graph_for(idx)
    assert g is not None and g.size > 0 and len(g.cites) == g.size
    sources = idx.meta.column("source_ids").to_pylist()
    assert any(c.size for c in g.cites)
    for node in range(g.size):
        for row in g.cites[node].tolist():
            assert idx.kinds[row] == "message"
            assert set(sources[row]) <= set(sources[int(g.rows[node])])


def test_expand_boosts_the_turns_cited_by_walked_nodes(retriever: Retriever) -> None:
    """Each row gains bonus × the largest visits / max visits of a walked non-seed node citing it;
    seeds, uncited rows and the nodes themselves keep their starting score."""
    from retrieval.strategies import Query
    from retrieval.strategies.walk import expand
    from retrieval.walk import graph_for, walk_from_scores

    r = retriever
    settings = r.settings
    user = r.store.users()[0]
    idx = r.user_index(user)
    vec = r.embed(["what did they do on the weekend?"])[0]
    q = Query(idx, vec, None, 5, settings, settings.kinds)
    rows = q.rows()
    ranked = idx.z[rows] @ vec
    bonus = 0.1
    out = expand(q, rows, ranked, by="walked", bonus=bonus, cite=True, own=False)
    assert out is not None
    got_rows, got = out
    g = graph_for(idx)
    full = np.full(idx.size, -np.inf)
    full[rows] = ranked
    walked = walk_from_scores(idx, g, vec, full)
    gain = {n: c for n, c in walked.visits.items() if n not in set(walked.seeds)}
    assert gain, "the walks leave their seeds"
    top = max(gain.values())
    want: dict[int, float] = {}
    for n, c in gain.items():
        for row in g.cites[n].tolist():
            want[row] = max(want.get(row, 0.0), bonus * c / top)
    start = dict(zip(rows.tolist(), ranked.tolist()))
    for row, sc in zip(got_rows.tolist(), got.tolist()):
        assert sc == pytest.approx(start[row] + want.get(row, 0.0), abs=1e-5)
    assert q.signals["walk_boosted"] == len(want)
    ids = idx.meta.column("id").to_pylist()
    assert q.signals["walk_nodes"] == [ids[int(g.rows[n])] for n in walked.ranked()]
    assert set(want) and all(idx.kinds[row] == "message" for row in want)


@pytest.mark.parametrize("strategy", ["walk", "hybrid-walk"])
def test_walk_results_are_deduplicated(retriever: Retriever, strategy: str) -> None:
    """No returned memory cites only messages already cited above it."""
    from retrieval.context import is_profile

    r = retriever
    user = r.store.users()[0]
    for text in ("what did they do on the weekend?", "work", "family and friends"):
        res = r.retrieve(user, text, k=8, strategy=strategy)
        seen: set[str] = set()
        for it in res.items:
            if is_profile(it) or not it.source_ids:
                continue
            assert set(it.source_ids) - seen
            seen |= set(it.source_ids)


def test_walk_never_seeds_from_unsearched_kinds(retriever: Retriever) -> None:
    """Searching raw turns only (no graph node searched): no seeds, no walk, the cosine ranking."""
    r = retriever
    user = r.store.users()[0]
    text = "what did they do on the weekend?"
    res = r.retrieve(user, text, k=5, strategy="walk", kinds=["message"])
    dense = r.retrieve(user, text, k=5, strategy="familiarity", kinds=["message"])
    assert res.signals["walk_steps"] == 0 and res.signals["walk_boosted"] == 0
    assert {it.kind for it in res.items} == {"message"}
    assert [it.id for it in res.items] == [it.id for it in dense.items]


def test_the_walk_is_seeded_by_the_query_text_not_its_last_bits() -> None:
    """The service embeds single-threaded: its vector may differ in the last bits from the API's,
    and a walk seeded by the vector's bytes went elsewhere. The text seeds it when given."""
    q = np.linspace(-1, 1, 8).astype(np.float32)
    nudged = np.nextafter(q, np.float32(2))
    draws = lambda rng: rng.random(4).tolist()   # noqa: E731
    assert draws(walk_rng("u", q, "my dog")) == draws(walk_rng("u", nudged, "my dog"))
    assert draws(walk_rng("u", q, "my dog")) != draws(walk_rng("u", q, "my cat"))
    assert draws(walk_rng("u", q)) != draws(walk_rng("u", nudged))     # no text: the vector still seeds
    assert draws(walk_rng("u", q, "my dog")) != draws(walk_rng("v", q, "my dog"))
