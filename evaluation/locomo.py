"""`mnemo bench locomo`: evidence Recall@K per LoCoMo category and strategy, with latency.

The file is consolidated with the `rules` backend into a (temporary) store; every strategy (and the
`dense` baseline over raw turns) is scored with `common.evaluate`. Questions are embedded once, in
one batch, before the clock: latencies are retrieval only (`signals.timings.retrieve_ms`), warm cache.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from evaluation.common import (CATEGORIES, consolidate_locomo, dense_legend, evaluate, load_questions, scratch_store,
                               warm_up)
from memory.runs import RunReport
from memory.settings import Settings
from retrieval.retriever import Retriever
from retrieval.strategies import STRATEGIES


def memweaver_cost(report: RunReport) -> str:
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


def table(rows: list[dict[str, Any]], ks: Sequence[int]) -> str:
    """A Markdown table of evaluation rows."""
    cols = [f"R@{k} c{c}" for k in ks for c in CATEGORIES] + [f"R@{k}" for k in ks] + ["p50 ms", "p99 ms",
                                                                                          "timed", "recollection"]
    head = ["strategy"] + [c.replace(" c", " ") for c in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["strategy"]] + [str(row[c]) if c == "timed" else f"{row[c]:.3f}" if "ms" not in c
                                     else f"{row[c]:.2f}" for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bench_locomo(path: str, *, extraction: str = "rules", strategies: Sequence[str] | None = None,
                 ks: Sequence[int] = (5, 10), store: str | None = None,
                 settings: Settings | None = None) -> str:
    """Consolidate the file into a (temporary) store, then score every strategy on it."""
    cfg = settings or Settings()
    with scratch_store(store, "mnemo-locomo-") as root:
        st, report = consolidate_locomo(path, root, extraction, cfg)
        r = Retriever(st, cfg)
        questions = load_questions(path, st)
        vecs = r.embed([q["question"] for q in questions])
        names = list(strategies or STRATEGIES)
        if "dense" not in names:
            names.insert(0, "dense")
        warm_up(r, questions, vecs, max(ks), names)   # every user's index loaded before timing
        rows = [evaluate(r, questions, vecs, name, ks) for name in names]
        counts = {t: sum(st.count_by_user(t).values())
                  for t in ("messages", "fragments", "insights", "topics", "summaries")}
        header = (f"LoCoMo {Path(path).name}, extraction={extraction}, {len(questions)} questions "
                  f"(categories 1-4), memory {counts}, searched kinds {','.join(r.settings.kinds)}, "
                  f"default strategy {r.settings.default_strategy}\n"
                  f"categories: " + ", ".join(f"{c}={n}" for c, n in CATEGORIES.items()) +
                  f"; {dense_legend('turns', r.settings.validity)} (baseline); timed = queries behind p50 / p99 "
                  "(at the largest K); recollection = share of queries routed there\n"
                  + memweaver_cost(report) + "\n")
        return header + table(rows, ks)
