"""The RMM reranker: REINFORCE gradient, learning on a synthetic task, versioned storage, corrupt
versions ignored, the retriever's rerank path, and the train stage (skip, incremental, per user)."""
from __future__ import annotations

import importlib
import logging
from datetime import datetime, timezone

import numpy as np
import pytest

from memory.embed import Embedder
from memory.errors import ConfigError
from memory.settings import load_settings
from memory.store import Store
from retrieval import RetrievalSettings, Retriever
from retrieval.rerank import (GLOBAL, Example, Reranker, RerankerCache, TrainConfig, load_latest, loss_grad,
                              save_version, scope_key, train, train_reranker)
from tests.helpers import ALICE, BOB, write_user

DIM = 16


def _example(rng: np.random.Generator, k: int = 8) -> Example:
    q = rng.standard_normal(DIM)
    q /= np.linalg.norm(q)
    m = rng.standard_normal((k, DIM))
    m /= np.linalg.norm(m, axis=1, keepdims=True)
    shown = np.arange(5)
    reward = np.where(q[0] * m[shown, 1] > 0, 1.0, -1.0)    # "cited": a bilinear relation q'm' can learn
    return Example(q.astype(np.float32), m.astype(np.float32), np.zeros(k, np.float32), shown, reward)


@pytest.mark.parametrize("deduped", [False, True])
def test_gradient_matches_finite_differences(deduped: bool) -> None:
    rng = np.random.default_rng(1)
    ex = _example(rng)
    if deduped:      # candidate 5 is covered once 0 and 1 are shown, 6 once 2 is
        ex.sources = [["a"], ["b"], ["c"], ["d"], ["e"], ["a", "b"], ["c"], ["f"]]
    model = Reranker(rng.standard_normal((DIM, DIM)) * 0.1, rng.standard_normal((DIM, DIM)) * 0.1)
    cfg = TrainConfig()
    _, gq, gm = loss_grad(model, ex, cfg, np.random.default_rng(7))
    eps = 1e-5
    for name, grad in (("wq", gq), ("wm", gm)):
        for i, j in ((0, 1), (3, 2), (5, 5)):
            w = getattr(model, name)
            old = w[i, j]
            w[i, j] = old + eps
            up = loss_grad(model, ex, cfg, np.random.default_rng(7))[0]
            w[i, j] = old - eps
            down = loss_grad(model, ex, cfg, np.random.default_rng(7))[0]
            w[i, j] = old
            assert abs((up - down) / (2 * eps) - grad[i, j]) < 1e-4 * max(1.0, abs(grad[i, j]))


def test_covered_candidates_leave_the_plackett_luce_denominator() -> None:
    """With a deduplicating base strategy, log P(shown) sums over the candidates still showable."""
    from retrieval.rerank import pl_grad

    z = np.array([2.0, 1.0, 0.5, 0.0, 1.5])
    ex = Example(np.zeros(DIM, np.float32), np.zeros((5, DIM), np.float32), z.astype(np.float32),
                 np.array([0, 2]), np.array([1.0, 1.0]), sources=[["a"], ["a"], ["b"], ["c"], ["a", "b"]])
    cfg = TrainConfig(temperature=1.0, baseline=0.0)
    loss, _, _ = pl_grad(Reranker.identity(DIM), ex, ex.shown, np.array([1.0, 1.0]), cfg)
    # step 1 over all five; step 2 without 0 (shown) and 1 (its only source "a" is shown)
    want = -(z[0] - np.log(np.exp(z).sum())) - (z[2] - np.log(np.exp(z[[2, 3, 4]]).sum()))
    assert loss == pytest.approx(want)
    ex.sources = None
    plain, _, _ = pl_grad(Reranker.identity(DIM), ex, ex.shown, np.array([1.0, 1.0]), cfg)
    assert plain == pytest.approx(-(z[0] - np.log(np.exp(z).sum())) - (z[2] - np.log(np.exp(z[1:]).sum())))


def test_training_moves_cited_items_up() -> None:
    rng = np.random.default_rng(0)
    examples = [_example(rng) for _ in range(400)]
    model, metrics = train(examples, DIM, cfg=TrainConfig(epochs=10, top_m=2, lr=0.05))
    assert metrics["steps"] == 1000 and metrics["examples"] == 400
    assert metrics["cited_in_top_m_after"] > metrics["cited_in_top_m_before"] + 0.1
    identity = Reranker.identity(DIM)
    ex = examples[0]
    assert np.allclose(identity.scores(ex.q, ex.m), ex.m @ ex.q)     # W = 0 keeps the base scores


def test_versions_roundtrip_and_corrupt_ones_are_ignored(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng(0)
    a = Reranker(rng.standard_normal((384, 384)).astype(np.float32) * 0.01, np.zeros((384, 384), np.float32))
    until = datetime(2024, 1, 1, tzinfo=timezone.utc)
    assert save_version(store, a, GLOBAL, feedback_until=until, metrics={"x": 1}) == 1
    assert save_version(store, Reranker.identity(384), GLOBAL, feedback_until=until, metrics={}) == 2
    model, row = load_latest(store, GLOBAL)
    assert model is not None and model.version == 2 and row is not None
    # corrupt version 2's bytes: it is skipped with a warning, version 1 is used
    bad = dict(row)
    bad["weights"] = row["weights"][:-8]
    store.upsert("rerankers", [bad])
    with caplog.at_level(logging.WARNING):
        model, _ = load_latest(store, GLOBAL)
    assert model is not None and model.version == 1 and np.allclose(model.wq, a.wq)
    assert "ignoring reranker global version 2" in caplog.text
    assert load_latest(store, scope_key("user", "nobody"))[0] is None


def test_reranker_cache_holds_at_most_max_scopes(store: Store) -> None:
    """Per-user scopes of a stream of user ids are dropped least recently used first; a dropped scope
    loads again on its next use."""
    mine = Reranker.identity(384)
    save_version(store, mine, scope_key("user", "u0"), feedback_until=datetime(2024, 1, 1, tzinfo=timezone.utc),
                 metrics={})
    cache = RerankerCache(store, refresh_ms=60_000, max_scopes=3)
    assert cache.get(scope_key("user", "u0")) is not None
    for i in range(1, 6):
        assert cache.get(scope_key("user", f"u{i}")) is None
    assert len(cache) == 3
    again = cache.get(scope_key("user", "u0"))
    assert again is not None and again.version == 1 and len(cache) == 3


@pytest.fixture()
def retriever(store: Store, embedder: Embedder) -> Retriever:
    write_user(store, embedder, "alice", ALICE)
    write_user(store, embedder, "bob", BOB)
    return Retriever(store, RetrievalSettings(refresh_ms=0), embedder=embedder)


def test_retriever_reranks_top_k_to_top_m(retriever: Retriever, caplog: pytest.LogCaptureFixture) -> None:
    q = "what is my dog called?"
    base = retriever.retrieve("alice", q, k=5, strategy="familiarity")
    with caplog.at_level(logging.WARNING):
        none = retriever.retrieve("alice", q, strategy="familiarity", rerank=True)
    assert none.ids == base.ids and none.signals["reranker"] is None and "no valid reranker" in caplog.text
    save_version(retriever.store, Reranker.identity(384), GLOBAL, feedback_until=datetime.now(timezone.utc),
                 metrics={})
    same = retriever.retrieve("alice", q, strategy="familiarity", rerank=True)
    assert same.ids == base.ids and same.signals["reranker"]["version"] == 1
    assert same.signals["reranker"]["candidates"] == 13 and "rerank_ms" in same.signals["timings"]
    # a reranker that prefers one memory puts it first
    emb = retriever.embed(["Rex loves the beach"])[0]
    target = retriever.retrieve("alice", emb, k=1, strategy="familiarity").ids[0]
    qv = retriever.embed(["I went hiking in the Alps"])[0]
    wq = np.outer(emb, qv).astype(np.float32) * 5                     # q' = q + 5 emb for this query
    save_version(retriever.store, Reranker(wq, np.zeros((384, 384), np.float32)), GLOBAL,
                 feedback_until=datetime.now(timezone.utc), metrics={})
    moved = retriever.retrieve("alice", qv, strategy="familiarity", rerank=True)
    assert moved.ids[0] == target and moved.signals["reranker"]["version"] == 2


def test_train_stage_skips_then_trains_incrementally(retriever: Retriever) -> None:
    assert train_reranker(retriever)[0].skipped == "no new feedback"
    for q in ("what is my dog called?", "which band do I like?", "what did I paint?"):
        res = retriever.retrieve("alice", q, k=5, strategy="familiarity")
        retriever.feedback("alice", q, res.ids, res.ids[:1])
    res = retriever.retrieve("bob", "when do I play chess?", k=2, strategy="familiarity")
    retriever.feedback("bob", "when do I play chess?", res.ids, res.ids[1:])
    first = train_reranker(retriever, strategy="familiarity")
    assert [(r.scope, r.version, r.feedback) for r in first] == [(GLOBAL, 1, 4)]
    assert first[0].metrics["steps"] == 1 and first[0].metrics["examples"] == 4
    assert train_reranker(retriever)[0].skipped == "no new feedback"       # nothing newer than v1
    retriever.feedback("alice", "where did I go hiking?", res_ids := retriever.retrieve(
        "alice", "where did I go hiking?", k=5).ids, res_ids[:2])
    second = train_reranker(retriever, strategy="familiarity")
    assert (second[0].version, second[0].feedback, second[0].metrics["from_version"]) == (2, 1, 1)
    per_user = train_reranker(retriever, scope="user", strategy="familiarity")
    assert sorted((r.scope, r.version) for r in per_user) == [("user:alice", 1), ("user:bob", 1)]
    assert per_user[0].metrics["from_version"] == 2                      # started from the global one


def test_no_version_from_feedback_without_citations_or_that_ranks_the_cited_lower(
        retriever: Retriever, monkeypatch: pytest.MonkeyPatch) -> None:
    """Feedback citing nothing makes every advantage negative: it would only push the shown memories
    down, and each nightly version starts from the last; a version ranking the cited memories lower
    than before is not written either."""
    training = importlib.import_module("retrieval.rerank.train")   # the package's `train` is the function

    for q in ("what is my dog called?", "which band do I like?"):
        retriever.feedback("alice", q, retriever.retrieve("alice", q, k=5, strategy="familiarity").ids, [])
    [none] = train_reranker(retriever, strategy="familiarity")
    assert none.version is None and none.skipped == "no cited memory in the new feedback"
    res = retriever.retrieve("alice", "where did I go hiking?", k=5, strategy="familiarity")
    retriever.feedback("alice", "where did I go hiking?", res.ids, res.ids[:1])
    worse = {"cited_in_top_m_before": 1.0, "cited_in_top_m_after": 0.5}
    monkeypatch.setattr(training, "train", lambda *a, **k: (Reranker.identity(384), dict(worse)))
    [refused] = train_reranker(retriever, strategy="familiarity")
    assert refused.version is None and refused.skipped is not None and "1.000 -> 0.500" in refused.skipped
    assert load_latest(retriever.store, GLOBAL)[0] is None
    monkeypatch.undo()
    [trained] = train_reranker(retriever, strategy="familiarity")     # with a citation it trains on all 3
    assert trained.version == 1 and trained.feedback == 3


def test_low_rank_l2_clip_and_resampling_train_and_stay_finite() -> None:
    rng = np.random.default_rng(0)
    examples = [_example(rng) for _ in range(200)]
    model, metrics = train(examples, DIM, cfg=TrainConfig(epochs=5, top_m=2, lr=0.05, rank=2, l2=1e-3, clip=5.0))
    assert np.linalg.matrix_rank(model.wq, tol=1e-5) <= 2 and np.linalg.matrix_rank(model.wm, tol=1e-5) <= 2
    assert np.isfinite(model.wq).all() and metrics["config"]["rank"] == 2
    sampled, m2 = train(examples, DIM, cfg=TrainConfig(epochs=5, top_m=2, lr=0.05, samples=2))
    assert m2["cited_in_top_m_after"] > m2["cited_in_top_m_before"]
    # a large L2 pull keeps the residual adapters near 0
    pulled, _ = train(examples, DIM, cfg=TrainConfig(epochs=5, top_m=2, lr=0.05, l2=5.0))
    free, _ = train(examples, DIM, cfg=TrainConfig(epochs=5, top_m=2, lr=0.05))
    assert np.linalg.norm(pulled.wq) < np.linalg.norm(free.wq)


def test_train_config_from_settings_keeps_paper_defaults() -> None:
    cfg = TrainConfig.from_settings(RetrievalSettings())
    assert (cfg.lr, cfg.batch_size, cfg.temperature, cfg.baseline, cfg.top_k, cfg.top_m) == (1e-3, 4, 0.5, 0.5, 20, 5)
    assert (cfg.epochs, cfg.samples, cfg.rank, cfg.l2) == (1, 0, 0, 0.0)
    cfg = TrainConfig.from_settings(RetrievalSettings(rerank_epochs=40, rerank_l2=0.05), epochs=None)
    assert (cfg.epochs, cfg.l2) == (40, 0.05)
    assert TrainConfig.from_settings(RetrievalSettings(), epochs=3).epochs == 3


def test_mean_baseline_is_the_mean_reward_and_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """"mean" centres the advantages: with 1 cited of 5 shown, b = -0.6 (A.1's 0.5 makes 4 of 5 negative)."""
    from retrieval.rerank import resolve_baseline

    rng = np.random.default_rng(3)
    examples = [_example(rng) for _ in range(20)]
    for ex in examples:
        ex.reward = np.array([1.0, -1.0, -1.0, -1.0, -1.0])
    assert resolve_baseline("mean", examples) == pytest.approx(-0.6)
    assert resolve_baseline(0.5, examples) == 0.5
    with pytest.raises(ConfigError, match="baseline"):
        resolve_baseline("median", examples)
    _, metrics = train(examples, DIM, cfg=TrainConfig(baseline="mean"))
    assert metrics["config"]["baseline"] == pytest.approx(-0.6)
    monkeypatch.setenv("MNEMO_RETRIEVAL_RERANK_BASELINE", "mean")
    assert TrainConfig.from_settings(load_settings().retrieval).baseline == "mean"
    monkeypatch.setenv("MNEMO_RETRIEVAL_RERANK_BASELINE", "-0.8")
    assert TrainConfig.from_settings(load_settings().retrieval).baseline == -0.8


def test_novel_order_skips_candidates_whose_sources_are_covered_above() -> None:
    from retrieval.strategies import novel_order

    sources = [["a"], ["a", "b"], ["b"], ["c"], None]
    assert novel_order(sources, np.array([1, 0, 2, 3, 4]), 3).tolist() == [1, 3, 4]
    assert novel_order(sources, np.array([0, 1, 2, 3]), 2).tolist() == [0, 1]


def test_reranked_hybrid_results_keep_every_item_novel(retriever: Retriever) -> None:
    text = "hiking in the Alps and my pets"
    qv = retriever.embed([text])[0]
    base = retriever.retrieve("alice", qv, k=20, strategy="rfmem-hybrid", text=text)
    assert base.items[0].source_ids == ["alice:D1:0"] and base.ids[1] == "alice-i0"   # novel by D1:1 alone
    ins = retriever.embed(["pets: Alice has pets and cares for them"])[0]
    wq = np.outer(ins, qv).astype(np.float32) * 5            # lift the insight (sources D1:0, D1:1) to the top
    save_version(retriever.store, Reranker(wq, np.zeros((384, 384), np.float32)), GLOBAL,
                 feedback_until=datetime.now(timezone.utc), metrics={})
    res = retriever.retrieve("alice", qv, k=5, strategy="rfmem-hybrid", text=text, rerank=True)
    assert res.ids[0] == "alice-i0" and res.signals["reranker"]["version"] == 1
    seen: set[str] = set()
    for it in res.items:
        assert set(it.source_ids) - seen, f"{it.id} cites only sources already shown above it"
        seen |= set(it.source_ids)


def test_bench_ceilings_bound_the_base_and_the_interval_is_paired(retriever: Retriever) -> None:
    from evaluation.rerank import ceilings, paired_ci

    asks = [("what is my dog called?", "alice:D1:1"), ("where did I go hiking?", "alice:D1:0"),
            ("what pet did we adopt?", "alice:D1:4"), ("which band do I like?", "alice:D1:5"),
            ("what do I paint?", "alice:D1:2"), ("how is work going?", "alice:D1:3")]
    questions = [{"user": "alice", "question": q, "evidence": {e}} for q, e in asks]
    vecs = retriever.embed([q for q, _ in asks])
    c = ceilings(retriever, questions, vecs, [0, 1, 2], [3, 4, 5], "rfmem-hybrid")
    assert set(c) == {"base", "oracle", "supervised", "supervised_per_source"}
    assert all(0.0 <= v <= 1.0 for v in c.values())
    assert c["oracle"] == 1.0                                   # every evidence turn is a candidate here
    assert paired_ci([0.2, 0.4, 0.6], [0.3, 0.5, 0.7]) == pytest.approx((0.1, 0.1))
    lo, hi = paired_ci([0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0])
    assert lo < 0.0 < hi


def test_zero_epochs_are_refused() -> None:
    """Zero passes would save the untrained weights as a version and mark the feedback consumed."""
    with pytest.raises(ConfigError, match="epochs must be at least 1, got 0"):
        TrainConfig(epochs=0)
    with pytest.raises(ConfigError, match="got -3"):
        TrainConfig.from_settings(load_settings().retrieval, epochs=-3)
