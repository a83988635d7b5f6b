"""`mnemo bench forget PATH`: forget one session per LoCoMo user and measure what it costs and what it
does to retrieval.

The file is consolidated into a (temporary) store with `rules-cached`, the `rules` heuristics behind a
live backend's path (every answer goes into the LLM response cache, as a paid model's would), so the
re-derivation's "LLM calls paid" are the prompts that changed and its cache hits the ones that did
not. Then, per user, the session in the middle of its history (by time; `which` picks another) is
forgotten with `memory.forget.forget` (purge included). Printed: wall time, rows deleted and
re-derived per table, LLM calls paid and cache hits, vectors reused, bytes reclaimed, and evidence
Recall@10 of the default strategy on the questions whose evidence lies outside the session their own
user forgot (LoCoMo's session and turn ids repeat in every conversation), before vs after (the issue
allows a drop of at most 0.01), with a paired bootstrap interval.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from evaluation.common import load_questions, paired_ci, recall_at, scratch_store
from memory.forget import ForgetReport, forget
from memory.forget_purge import dir_bytes
from memory.ingest import ingest
from memory.llm.base import RulesAnswers, register_backend
from memory.runs import consolidate, open_store
from memory.settings import Settings
from memory.store import Store
from retrieval.retriever import Retriever

BACKEND = "rules-cached"
K = 10


@register_backend(BACKEND)
class CachedRules(RulesAnswers):
    """`rules` through a live backend's path: its answers are cached like a paid model's."""

    name = BACKEND
    live = True
    default_model = "rules-v1-cached"


def pick_session(store: Store, user: str, which: str) -> str:
    """The user's first, middle or last session by time."""
    rows = sorted(store.read("sessions", user, columns=["session_id", "ts"]).to_pylist(),
                  key=lambda r: (r["ts"], r["session_id"]))
    index = {"first": 0, "middle": len(rows) // 2, "last": len(rows) - 1}[which]
    return str(rows[index]["session_id"])


def sessions_of(store: Store, users: Sequence[str]) -> dict[str, dict[str, str]]:
    """user -> (message id -> session id): ids are per user (every LoCoMo user has a `D5:3`)."""
    out = {}
    for u in users:
        t = store.read("messages", u, columns=["message_id", "session_id"])
        out[u] = dict(zip(t.column("message_id").to_pylist(), t.column("session_id").to_pylist()))
    return out


def outside_forgotten(questions: list[dict[str, Any]], session_of: dict[str, dict[str, str]],
                      chosen: dict[str, str]) -> list[dict[str, Any]]:
    """The questions none of whose evidence lies in the session their own user forgets (`chosen`:
    user -> session; `session_of`: per user, message id -> session id)."""
    def kept(q: dict[str, Any]) -> bool:
        own, gone = session_of.get(q["user"], {}), chosen.get(q["user"])
        return gone is None or all(own.get(e) != gone for e in q["evidence"])
    return [q for q in questions if kept(q)]


def recalls(r: Retriever, questions: list[dict[str, Any]], vecs: np.ndarray) -> list[float]:
    """Recall@10 of the default strategy per question."""
    return [recall_at(r.retrieve(q["user"], v, k=K, text=q["question"]).items, q["evidence"], K)
            for q, v in zip(questions, vecs)]


def bench_forget(path: str, *, which: str = "middle", store: str | None = None,
                 settings: Settings | None = None) -> str:
    """Consolidate, forget one session per user, print the figures (see the module docstring)."""
    with scratch_store(store, "mnemo-forget-") as root:
        cfg = (settings or Settings()).with_overrides(store=root, llm=BACKEND)
        st = open_store(cfg)
        ingest(st, path, "locomo")
        t0 = time.perf_counter()
        run = consolidate(st, cfg)
        consolidate_s = time.perf_counter() - t0
        chosen = {u: pick_session(st, u, which) for u in st.users()}
        questions = outside_forgotten(load_questions(path, st), sessions_of(st, list(chosen)), chosen)
        r = Retriever(st, cfg)
        vecs = r.embed([q["question"] for q in questions])
        before = recalls(r, questions, vecs)
        size_before = dir_bytes(root)
        reports: list[ForgetReport] = []
        t0 = time.perf_counter()
        for user, session in chosen.items():
            reports.append(forget(st, cfg, user, sessions=[session]))
        wall = time.perf_counter() - t0
        after = recalls(Retriever(st, cfg), questions, vecs)
        return render(path, which, run.llm, consolidate_s, reports, wall, size_before, dir_bytes(root),
                      before, after)


def render(path: str, which: str, run_llm: dict[str, int], consolidate_s: float, reports: list[ForgetReport],
           wall: float, size_before: int, size_after: int, before: Sequence[float], after: Sequence[float]) -> str:
    """The benchmark's figures as Markdown."""
    tables = sorted({t for rep in reports for t in list(rep.deleted) + list(rep.rederived)})
    lines = [f"LoCoMo {Path(path).name}: forget the {which} session of each of {len(reports)} users "
             f"(backend {BACKEND}: rules answers cached like a paid model's)",
             f"consolidation first: {consolidate_s:.1f}s, {run_llm.get('calls', 0)} LLM calls", "",
             "| user | session | messages | sessions re-derived | LLM calls paid | cache hits | vectors reused | "
             "bytes reclaimed | seconds |", "|---|---|---|---|---|---|---|---|---|"]
    for rep in reports:
        lines.append(f"| {rep.user_id} | {', '.join(rep.scope['sessions'])} | {rep.messages} | {rep.sessions_rerun} "
                     f"| {rep.llm_calls} | {rep.cache_hits} | {rep.vectors_reused} | {rep.bytes_reclaimed:,} "
                     f"| {rep.seconds:.1f} |")
    lines += ["", "| table | rows deleted | rows re-derived |", "|---|---|---|"]
    for t in tables:
        lines.append(f"| {t} | {sum(r.deleted.get(t, 0) for r in reports)} | "
                     f"{sum(r.rederived.get(t, 0) for r in reports)} |")
    calls = sum(r.llm_calls for r in reports)
    hits = sum(r.cache_hits for r in reports)
    b, a = float(np.mean(before)), float(np.mean(after))
    lo, hi = paired_ci(before, after)
    lines += ["", "| figure | value |", "|---|---|",
              f"| wall time, {len(reports)} forgets (purge included) | {wall:.1f}s |",
              f"| LLM calls paid / cache hits | {calls} / {hits} ({100 * hits / max(1, calls + hits):.0f} % hits) |",
              f"| store size before / after the forgets | {size_before:,} / {size_after:,} bytes "
              f"({size_before - size_after:+,}) |",
              f"| Recall@{K} (default strategy), {len(before)} questions with evidence outside the forgotten "
              f"sessions | {b:.3f} -> {a:.3f} ({a - b:+.3f}, 95 % CI [{lo:+.3f}, {hi:+.3f}]) |",
              f"| drop within 0.01 | {'yes' if b - a <= 0.01 else 'NO'} |"]
    return "\n".join(lines)
