"""What the benchmarks share: a scratch store, LoCoMo loading and consolidation, Recall@K,
per-strategy evaluation and a paired bootstrap interval.

Recall@K (data/locomo/README.md): walk the K items a strategy returns, collect their source
message ids, stop at K distinct ids, score the share of the question's evidence ids among them.
Category 5 (adversarial) is skipped.
"""
from __future__ import annotations

import json
import logging
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from memory.errors import ConfigError
from memory.ingest import ingest
from memory.runs import RunReport, consolidate, open_store
from memory.settings import Settings
from memory.store import Store
from retrieval.context import is_profile
from retrieval.retriever import RetrievalResult, Retriever

log = logging.getLogger(__name__)

#: LoCoMo question categories scored (5, adversarial, is skipped)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
_DIA = re.compile(r"D\d+:\d+")
#: an evidence reference as LoCoMo writes it, a stray colon included ("D:11:26" on conv-43)
_EVIDENCE = re.compile(r"D:?(\d+):(\d+)")


@contextmanager
def scratch_store(store: str | None, prefix: str) -> Iterator[str]:
    """`store` itself, or a store directory in a temporary folder removed afterwards (on errors too)."""
    if store is not None:
        yield store
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield str(Path(tmp) / "store")


def first_sources(items: Sequence[Any], k: int) -> set[str]:
    """The first k distinct source ids of the ranked items (the pinned MemWeaver profile is context,
    not ranked evidence: skipped)."""
    seen: dict[str, None] = {}
    for it in items:
        if is_profile(it):
            continue
        for sid in it.source_ids:
            seen.setdefault(sid)
            if len(seen) >= k:
                return set(seen)
    return set(seen)


def recall_at(items: Sequence[Any], evidence: set[str], k: int) -> float:
    """Share of `evidence` among the first k distinct source ids of the ranked items."""
    return len(evidence & first_sources(items, k)) / len(evidence) if evidence else 0.0


def consolidate_locomo(path: str, store_dir: str, extraction: str,
                       settings: Settings | None = None) -> tuple[Store, RunReport]:
    """Ingest the LoCoMo file and consolidate it with the `rules` backend: the Store and the
    consolidation's RunReport (empty counts when the store was already consolidated).
    `settings` (default `Settings()`) gives every knob but the store and the backend."""
    if extraction not in ("rules", "observations"):
        raise ConfigError(f"unknown extraction {extraction!r} (known: rules, observations)",
                          extraction=extraction)
    cfg = (settings or Settings()).with_overrides(store=store_dir, llm="rules")
    store = open_store(cfg)
    ingest(store, path, "locomo", observations_as_fragments=extraction == "observations")
    report = consolidate(store, cfg)
    log.info("%s", report.summary())
    return store, report


def load_questions(path: str, store: Store) -> list[dict[str, Any]]:
    """Questions of categories 1-4 with their user id and evidence mapped to stored message ids."""
    users = store.users()
    by_user: dict[str, dict[str, str]] = {}
    for u in users:
        ids = store.read("messages", u, columns=["message_id"]).column("message_id").to_pylist()
        by_user[u] = {d: m for m in ids if (d := _dia(m))}
    out, missing = [], 0
    for sample in json.loads(Path(path).read_text()):
        sid = sample.get("sample_id", "")
        user = next((u for u in users if u == sid or sid in u), None)
        if user is None:
            log.warning("no user for sample %s", sid)
            continue
        for qa in sample["qa"]:
            cat = int(qa.get("category", 0))
            if cat not in CATEGORIES:
                continue
            dias = {f"D{a}:{b}" for ev in qa.get("evidence", []) for a, b in _EVIDENCE.findall(str(ev))}
            if not dias:
                continue
            evidence = {by_user[user].get(d, f"missing:{d}") for d in dias}
            missing += sum(e.startswith("missing:") for e in evidence)
            out.append({"user": user, "question": qa["question"], "category": cat, "evidence": evidence})
    if missing:   # they count as never found, as in `mnemo bench beam`
        log.warning("%d evidence ids name no message of their conversation", missing)
    return out


def _dia(message_id: str) -> str | None:
    found = _DIA.findall(message_id)
    return found[-1] if found else None


def evaluate(r: Retriever, questions: list[dict[str, Any]], vecs: np.ndarray, strategy: str,
             ks: Sequence[int], *, groups: Sequence[Any] = tuple(CATEGORIES), key: str = "category",
             observe: Callable[[dict[str, Any], RetrievalResult], None] | None = None) -> dict[str, Any]:
    """Recall@K per group (`row["R@{k} c{group}"]`) and overall, latency and route shares for one
    strategy. A question's group is its `key` field (LoCoMo: its category, the groups
    `CATEGORIES`); `observe`, if given, sees every question with its result at the largest K."""
    recalls: dict[int, dict[Any, list[float]]] = {k: {c: [] for c in groups} for k in ks}
    latency: list[float] = []
    routes: dict[str, int] = {}
    for k in ks:
        for q, v in zip(questions, vecs):
            res: RetrievalResult = r.retrieve(q["user"], v, k=k, strategy=strategy, text=q["question"])
            recalls[k][q[key]].append(recall_at(res.items, q["evidence"], k))
            if k == max(ks):
                latency.append(res.signals["timings"]["retrieve_ms"])
                routes[res.route or "-"] = routes.get(res.route or "-", 0) + 1
                if observe is not None:
                    observe(q, res)
    row: dict[str, Any] = {"strategy": strategy}
    for k in ks:
        for c in groups:
            row[f"R@{k} c{c}"] = float(np.mean(recalls[k][c])) if recalls[k][c] else float("nan")
        row[f"R@{k}"] = float(np.mean([x for c in groups for x in recalls[k][c]]))
    row["p50 ms"] = float(np.median(latency))
    row["p99 ms"] = float(np.percentile(latency, 99))
    row["timed"] = len(latency)   # printed beside p50 / p99: a p99 of few queries is barely one
    row["recollection"] = routes.get("recollection", 0) / max(1, len(latency))
    return row


def dense_legend(unit: str, validity: bool) -> str:
    """What the `dense` baseline returns: top-K over raw `unit`s, and with validity ordering on
    (`retrieval.validity`, the default) also what it pulls into every strategy's result."""
    if not validity:
        return f"dense = top-K over raw {unit} (validity off)"
    return (f"dense = top-K over raw {unit}, plus the newer versions and contradiction counterparts validity "
            "pulls in (retrieval.validity)")


def first_of_each_user(questions: Sequence[dict[str, Any]]) -> dict[str, int]:
    """user -> index of that user's first question, in question order: the queries that load (build)
    each user's index, to warm or to time as cold."""
    first: dict[str, int] = {}
    for i, q in enumerate(questions):
        first.setdefault(q["user"], i)
    return first


def warm_up(r: Retriever, questions: Sequence[dict[str, Any]], vecs: np.ndarray, k: int,
            strategies: Sequence[str]) -> None:
    """Query every strategy once with the first question of every user, so no timed query pays a
    user's cold index load (questions are grouped by user: the first few would warm only one)."""
    for i in first_of_each_user(questions).values():
        q = questions[i]
        for name in strategies:
            r.retrieve(q["user"], vecs[i], k=k, strategy=name, text=q["question"])


def paired_ci(before: Sequence[float], after: Sequence[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % bootstrap interval of the mean per-question difference after − before."""
    d = np.asarray(after, dtype=np.float64) - np.asarray(before, dtype=np.float64)
    if d.size == 0:
        return float("nan"), float("nan")
    means = d[np.random.default_rng(seed).integers(0, d.size, size=(n, d.size))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)
