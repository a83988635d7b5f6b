"""`mnemo bench locomo` (evidence Recall@K per category and strategy) and `mnemo bench retrieval`
(latency on a synthetic 10k-memory user, in `retrieval.bench_latency`).

Recall@K (data/locomo/README.md): walk the K items a strategy returns, collect their source
message ids, stop at K distinct ids, score the share of the question's evidence ids among them.
Category 5 (adversarial) is skipped. Questions are embedded once, in one batch, before the clock:
latencies are retrieval only (`signals.timings.retrieve_ms`), warm cache.
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from memory.benchmark import scratch_store
from retrieval.retriever import RetrievalResult, Retriever
from retrieval.settings import RetrievalSettings
from retrieval.strategies import STRATEGIES

log = logging.getLogger(__name__)

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
_DIA = re.compile(r"D\d+:\d+")


def recall_at(items: Sequence[Any], evidence: set[str], k: int) -> float:
    """Share of `evidence` among the first k distinct source ids of the ranked items."""
    from retrieval.context import is_profile

    seen: list[str] = []
    for it in items:
        if is_profile(it):  # the pinned MemWeaver profile is context, not ranked evidence
            continue
        for sid in it.source_ids:
            if sid not in seen:
                seen.append(sid)
            if len(seen) >= k:
                break
        if len(seen) >= k:
            break
    return len(evidence & set(seen)) / len(evidence) if evidence else 0.0


def consolidate_locomo(path: str, store_dir: str, extraction: str) -> tuple[Any, Any]:
    """Ingest the LoCoMo file and consolidate it with the `rules` backend: the Store and the
    consolidation's RunReport (empty counts when the store was already consolidated)."""
    from memory.ingest import ingest
    from memory.runs import consolidate, open_store
    from memory.settings import Settings

    if extraction not in ("rules", "observations"):
        raise ValueError(f"unknown extraction {extraction!r} (known: rules, observations)")
    settings = Settings(store=store_dir, llm="rules")
    store = open_store(settings)
    ingest(store, path, "locomo", observations_as_fragments=extraction == "observations")
    report = consolidate(store, settings)
    log.info("%s", report.summary())
    return store, report




def memweaver_cost(report: Any) -> str:
    """What weave + summarize added to one consolidation run: time, share, LLM requests per session."""
    if not report.counts.get("sessions"):
        return "MemWeaver cost: n/a (the store was already consolidated)"
    t = report.timings
    mw = t.get("weave", 0.0) + t.get("summarize", 0.0)
    rest = sum(v for k, v in t.items() if k not in ("weave", "summarize", "topics"))
    n = report.counts["sessions"]
    calls = report.llm.get("memweaver_requests", 0)
    return (f"MemWeaver cost: weave {t.get('weave', 0.0):.1f}s + summarize {t.get('summarize', 0.0):.1f}s = "
            f"{mw:.1f}s, +{100 * mw / max(rest, 1e-9):.1f} % of the PREMem stages' {rest:.1f}s "
            f"({1000 * mw / n:.0f} ms/session); {calls} LLM requests ({calls / n:.2f}/session)")


def load_questions(path: str, store: Any) -> list[dict[str, Any]]:
    """Questions of categories 1-4 with their user id and evidence mapped to stored message ids."""
    users = store.users()
    by_user: dict[str, dict[str, str]] = {}
    for u in users:
        ids = store.read("messages", u, columns=["message_id"]).column("message_id").to_pylist()
        by_user[u] = {_dia(m): m for m in ids if _dia(m)}
    out = []
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
            dias = {d for ev in qa.get("evidence", []) for d in _DIA.findall(str(ev))}
            if not dias:
                continue
            evidence = {by_user[user].get(d, f"missing:{d}") for d in dias}
            out.append({"user": user, "question": qa["question"], "category": cat, "evidence": evidence})
    return out


def _dia(message_id: str) -> str | None:
    found = _DIA.findall(message_id)
    return found[-1] if found else None


def evaluate(r: Retriever, questions: list[dict[str, Any]], vecs: np.ndarray, strategy: str,
             ks: Sequence[int]) -> dict[str, Any]:
    """Recall@K per category and overall, latency and route shares for one strategy."""
    recalls: dict[int, dict[int, list[float]]] = {k: {c: [] for c in CATEGORIES} for k in ks}
    latency: list[float] = []
    routes: dict[str, int] = {}
    for k in ks:
        for q, v in zip(questions, vecs):
            res: RetrievalResult = r.retrieve(q["user"], v, k=k, strategy=strategy, text=q["question"])
            recalls[k][q["category"]].append(recall_at(res.items, q["evidence"], k))
            if k == max(ks):
                latency.append(res.signals["timings"]["retrieve_ms"])
                routes[res.route or "-"] = routes.get(res.route or "-", 0) + 1
    row: dict[str, Any] = {"strategy": strategy}
    for k in ks:
        for c in CATEGORIES:
            row[f"R@{k} c{c}"] = float(np.mean(recalls[k][c])) if recalls[k][c] else float("nan")
        row[f"R@{k}"] = float(np.mean([x for c in CATEGORIES for x in recalls[k][c]]))
    row["p50 ms"] = float(np.median(latency))
    row["p99 ms"] = float(np.percentile(latency, 99))
    row["recollection"] = routes.get("recollection", 0) / max(1, len(latency))
    return row


def table(rows: list[dict[str, Any]], ks: Sequence[int]) -> str:
    """A Markdown table of evaluation rows."""
    cols = [f"R@{k} c{c}" for k in ks for c in CATEGORIES] + [f"R@{k}" for k in ks] + ["p50 ms", "p99 ms",
                                                                                          "recollection"]
    head = ["strategy"] + [c.replace(" c", " ") for c in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["strategy"]] + [f"{row[c]:.3f}" if "ms" not in c else f"{row[c]:.2f}" for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bench_locomo(path: str, *, extraction: str = "rules", strategies: Sequence[str] | None = None,
                 ks: Sequence[int] = (5, 10), store: str | None = None,
                 settings: RetrievalSettings | None = None) -> str:
    """Consolidate the file into a (temporary) store, then score every strategy on it."""
    with scratch_store(store, "mnemo-locomo-") as root:
        st, report = consolidate_locomo(path, root, extraction)
        r = Retriever(st, settings or RetrievalSettings())
        questions = load_questions(path, st)
        vecs = r.embed([q["question"] for q in questions])
        names = list(strategies or STRATEGIES)
        if "dense" not in names:
            names.insert(0, "dense")
        for q, v in zip(questions[:20], vecs):  # warm every user's cache before timing
            r.retrieve(q["user"], v, k=max(ks), strategy="calibrated", text=q["question"])
        rows = [evaluate(r, questions, vecs, name, ks) for name in names]
        counts = {t: sum(st.count_by_user(t).values())
                  for t in ("messages", "fragments", "insights", "topics", "summaries")}
        header = (f"LoCoMo {Path(path).name}, extraction={extraction}, {len(questions)} questions "
                  f"(categories 1-4), memory {counts}, searched kinds {','.join(r.settings.kinds)}, "
                  f"default strategy {r.settings.default_strategy}\n"
                  f"categories: " + ", ".join(f"{c}={n}" for c, n in CATEGORIES.items()) +
                  "; dense = top-K over raw turns (baseline); recollection = share of queries routed there\n"
                  + memweaver_cost(report) + "\n")
        return header + table(rows, ks)
