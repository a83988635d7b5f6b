"""`mnemo bench rerank`: does RMM retrospective reflection help on LoCoMo, and what do topics add?

1. Consolidate the file with the `rules` backend (topics included) into a (temporary) store.
2. Split the questions (categories 1-4) in two by position within each conversation (even: train,
   odd: test). For every train question: retrieve k = 5 (no reranker), simulate the answering LLM's
   citations (a shown item is cited when its source ids intersect the question's evidence), post
   them through `Retriever.feedback`, then train one reranker version with `train_reranker`.
3. On the test half: Recall@5 of the base strategy without and with the reranker (top-20 -> top-5),
   and the reranking latency for 20 candidates (median of the in-retrieve `rerank_ms`, and of the
   bare NumPy scoring).
4. Ceilings of any top-20 -> top-5 reranker on the held-back half (`ceilings`): the evidence oracle,
   and a supervised reranker trained on the train half with every candidate labelled.
5. Recall@5 / @10 over all questions with the default searched kinds vs the same plus "topic".
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from evaluation.common import consolidate_locomo, load_questions, paired_ci, recall_at, scratch_store
from memory.errors import StoreError
from memory.schemas import MEMORY_TABLES
from memory.settings import Settings
from retrieval.rerank import GLOBAL, TrainConfig, load_latest, scope_key, train_reranker
from retrieval.retriever import Retriever

log = logging.getLogger(__name__)


def split(questions: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """Even positions of each user's questions train, odd ones test."""
    seen: dict[str, int] = {}
    train: list[int] = []
    test: list[int] = []
    for i, q in enumerate(questions):
        n = seen.get(q["user"], 0)
        seen[q["user"]] = n + 1
        (train if n % 2 == 0 else test).append(i)
    return train, test


def simulate_feedback(r: Retriever, questions: list[dict[str, Any]], vecs: np.ndarray, idx: Sequence[int],
                      k: int, strategy: str | None, explore: bool) -> dict[str, float]:
    """Retrieve (Gumbel-sampled top-k of the top-20 when `explore`, else the base top-k), cite the
    shown items whose sources hit the evidence, post the feedback."""
    shown_n = cited_n = posted = 0
    for i in idx:
        q = questions[i]
        res = r.retrieve(q["user"], vecs[i], k=k, strategy=strategy, text=q["question"], rerank=explore)
        shown = res.ids
        if not shown:
            continue
        cited = [it.id for it in res.items if set(it.source_ids) & q["evidence"]]
        r.feedback(q["user"], q["question"], shown, cited)
        shown_n += len(shown)
        cited_n += len(cited)
        posted += 1
    return {"posted": posted, "cited_share": cited_n / max(1, shown_n)}


def _recall(r: Retriever, questions: list[dict[str, Any]], vecs: np.ndarray, idx: Sequence[int], k: int,
            strategy: str | None, **kw: Any) -> tuple[float, list[float]]:
    vals, ms = _recalls(r, questions, vecs, idx, k, strategy, **kw)
    return float(np.mean(vals)) if vals else float("nan"), ms


def _recalls(r: Retriever, questions: list[dict[str, Any]], vecs: np.ndarray, idx: Sequence[int], k: int,
             strategy: str | None, **kw: Any) -> tuple[list[float], list[float]]:
    """Per-question Recall@k and the in-retrieve reranking times."""
    vals, ms = [], []
    for i in idx:
        q = questions[i]
        res = r.retrieve(q["user"], vecs[i], k=k, strategy=strategy, text=q["question"], **kw)
        vals.append(recall_at(res.items, q["evidence"], k))
        if "rerank_ms" in res.signals.get("timings", {}):
            ms.append(res.signals["timings"]["rerank_ms"])
    return vals, ms


KINDS = tuple(MEMORY_TABLES)


def _features(items: Sequence[Any]) -> np.ndarray:
    """Per candidate: base score, rank, kind, log #sources, and the share of the candidates' softmax
    score mass in its LoCoMo session ("D3:5" -> D3): what a reranker of the top-20 can see besides
    the embeddings."""
    base = np.asarray([it.score for it in items], dtype=np.float64)
    w = np.exp((base - base.max()) / 0.05)
    sessions = [{s.split(":")[0] for s in it.source_ids} or {""} for it in items]
    mass: dict[str, float] = {}
    for ss, wi in zip(sessions, w):
        for s in ss:
            mass[s] = mass.get(s, 0.0) + wi / len(ss)
    total = sum(mass.values())
    return np.asarray([[b, r / len(items), *[it.kind == k for k in KINDS], np.log(max(1, len(it.source_ids))),
                        max(mass[s] for s in ss) / total] for r, (it, b, ss) in enumerate(zip(items, base, sessions))])


def ceilings(r: Retriever, questions: list[dict[str, Any]], vecs: np.ndarray, train_idx: Sequence[int],
             test_idx: Sequence[int], strategy: str | None) -> dict[str, float]:
    """Held-back Recall@5 of three rerankings of the base top-20 (source-deduplicated like the retriever):
    `oracle` (evidence-hitting candidates first, fewest sources first: no reranker can beat it),
    `supervised` (logistic regression on `_features`, trained on the train half with every candidate
    labelled "cited", ranked by P(cited)) and `supervised_per_source` (ranked by P(cited) / √#sources,
    since a cited item with many sources spends more of the K distinct-source budget)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    from retrieval.strategies import novel_order

    def pool(i: int) -> list[Any]:
        q = questions[i]
        return r.retrieve(q["user"], vecs[i], k=20, strategy=strategy, text=q["question"], rerank=False).items

    def cited(items: Sequence[Any], ev: set[str]) -> np.ndarray:
        return np.asarray([bool(set(it.source_ids) & ev) for it in items])

    train = [(pool(i), questions[i]["evidence"]) for i in train_idx]
    x = np.concatenate([_features(items) for items, _ in train if items])
    y = np.concatenate([cited(items, ev) for items, ev in train if items])
    scaler = StandardScaler().fit(x)
    model = LogisticRegression(C=1.0, max_iter=5000).fit(scaler.transform(x), y)
    out: dict[str, list[float]] = {"base": [], "oracle": [], "supervised": [], "supervised_per_source": []}
    for i in test_idx:
        items, ev = pool(i), questions[i]["evidence"]
        if not items:
            continue
        sources = [list(it.source_ids) for it in items]
        n = np.asarray([max(1, len(s)) for s in sources], dtype=np.float64)
        hit = cited(items, ev)
        p = model.predict_proba(scaler.transform(_features(items)))[:, 1]
        orders = {"base": np.arange(len(items)),
                  "oracle": np.lexsort((np.arange(len(items)), n, ~hit)),
                  "supervised": np.argsort(-p, kind="stable"),
                  "supervised_per_source": np.argsort(-p / np.sqrt(n), kind="stable")}
        for name, order in orders.items():
            keep = novel_order(sources, order, 5)
            out[name].append(recall_at([items[j] for j in keep], ev, 5))
    return {k: float(np.mean(v)) if v else float("nan") for k, v in out.items()}


def _bare_latency(r: Retriever, key: str, dim: int, n: int = 2000) -> float:
    model, _ = load_latest(r.store, key)
    if model is None:
        return float("nan")
    rng = np.random.default_rng(0)
    q = rng.standard_normal(dim).astype(np.float32)
    m = rng.standard_normal((20, dim)).astype(np.float32)
    prior = np.zeros(20, np.float32)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        model.rerank(q, m, prior, 5)
        times.append((time.perf_counter() - t0) * 1000)
    return float(np.median(times))


def bench_rerank(path: str, *, store: str | None = None, strategy: str | None = None, epochs: int | None = None,
                 scope: str = GLOBAL, reset: bool = False, explore: bool = True,
                 settings: Settings | None = None) -> str:
    """Steps 1-5 of the module docstring on `path`, in `store` (default: a temporary one).
    `settings` (default `Settings()`) gives every knob but the store and the backend."""
    cfg = settings or Settings()
    with scratch_store(store, "mnemo-rerank-") as root:
        st, _ = consolidate_locomo(path, root, "rules", cfg)
        if st.has_table("feedback") or st.has_table("rerankers"):
            if not reset:
                raise StoreError(f"{root} already holds feedback or rerankers; pass --reset to drop them",
                                 store=root)
            for name in ("feedback", "rerankers"):
                if st.has_table(name):
                    st.drop_table(name)
        base = cfg.retrieval
        r = Retriever(st, cfg.model_copy(update={"retrieval": base.with_overrides(rerank_scope=scope)}))
        questions = load_questions(path, st)
        vecs = r.embed([q["question"] for q in questions])
        train_idx, test_idx = split(questions)
        name = strategy or base.default_strategy
        train_cfg = TrainConfig.from_settings(base, epochs=epochs)
        epochs = train_cfg.epochs
        lines = [f"LoCoMo {Path(path).name}: {len(questions)} questions (categories 1-4), "
                 f"train {len(train_idx)} / test {len(test_idx)} (alternating per conversation), "
                 f"strategy {name}, reranker scope {scope}, epochs {epochs}, "
                 f"feedback from {'Gumbel-sampled (explore)' if explore else 'deterministic'} top-5",
                 "train config: " + ", ".join(f"{k}={v}" for k, v in asdict(train_cfg).items())]

        t0 = time.perf_counter()
        collector = Retriever(st, r.settings.with_overrides(rerank_explore=True, rerank_seed=0),
                              embedder=r.embedder) if explore else r
        fb = simulate_feedback(collector, questions, vecs, train_idx, 5, name, explore)
        reports = train_reranker(r, scope=scope, cfg=train_cfg, strategy=name)
        lines.append(f"feedback: {fb['posted']} queries posted, {fb['cited_share']:.3f} of shown items cited; "
                     f"training {time.perf_counter() - t0:.1f}s")
        lines += ["  " + rep.summary() for rep in reports]

        per_before, _ = _recalls(r, questions, vecs, test_idx, 5, name, rerank=False)
        per_after, ms = _recalls(r, questions, vecs, test_idx, 5, name, rerank=True)
        before, after = float(np.mean(per_before)), float(np.mean(per_after))
        lo, hi = paired_ci(per_before, per_after)
        key = scope_key(scope, questions[0]["user"]) if scope != GLOBAL else GLOBAL
        bare = _bare_latency(r, key, st.dim)
        lines.append("")
        lines.append("| held-back half | Recall@5 |")
        lines.append("|---|---|")
        lines.append(f"| {name} | {before:.3f} |")
        lines.append(f"| {name} + reranker (top-20 -> top-5) | {after:.3f} |")
        lines.append(f"| delta | {after - before:+.3f} (95 % paired bootstrap {lo:+.3f} to {hi:+.3f}) |")
        lines.append(f"reranking 20 candidates: median {np.median(ms) if ms else float('nan'):.3f} ms in retrieve "
                     f"(p99 {np.percentile(ms, 99) if ms else float('nan'):.3f} ms; {len(ms)} timed), "
                     f"bare scoring median {bare:.3f} ms")

        c = ceilings(r, questions, vecs, train_idx, test_idx, name)
        lines.append("")
        lines.append(f"ceilings of a top-20 -> top-5 reranker on the held-back half (base {c['base']:.3f}): "
                     f"evidence oracle {c['oracle']:.3f}; supervised with every train candidate labelled, over "
                     f"base score, rank, kind, #sources and session share: {c['supervised']:.3f} ranked by "
                     f"P(cited), {c['supervised_per_source']:.3f} by P(cited)/sqrt(#sources)")

        every = list(range(len(questions)))
        kinds = tuple(base.kinds)
        with_topics = kinds + ("topic",) if "topic" not in kinds else kinds
        without = tuple(k for k in kinds if k != "topic")
        n_topics = sum(st.count_by_user("topics").values())
        lines.append("")
        lines.append(f"topic memories ({n_topics} stored), all {len(questions)} questions, strategy {name}:")
        lines.append("| searched kinds | Recall@5 | Recall@10 |")
        lines.append("|---|---|---|")
        for ks in (without, with_topics):
            r5, _ = _recall(r, questions, vecs, every, 5, name, kinds=ks, rerank=False)
            r10, _ = _recall(r, questions, vecs, every, 10, name, kinds=ks, rerank=False)
            lines.append(f"| {', '.join(ks)} | {r5:.3f} | {r10:.3f} |")
        return "\n".join(lines)
