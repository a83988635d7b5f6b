"""`mnemo bench beam`: evidence Recall@K per BEAM ability and strategy, update-first, retrieval
latency and consolidation cost, one table per chat scale.

A scale is a folder `DIR/SCALE/` of chats `N/` holding `chat.json` and `probing_questions.json`
(data/beam/README.md). Its chats are ingested with the `beam` reader (one user per chat,
`beam-<SCALE>-<N>`) into a (temporary) store and consolidated with the `rules` backend one chat at
a time, so seconds per chat and per stage are measured per chat; the embedding model is loaded before
the clock. With `copies` > 1 every chat is also filed under `copies - 1` more user ids
(`beam-100K-3-copy2`, ...) and consolidated too: a store of many users of realistic size. Questions are
asked of the original users only.

Scoring (`common.evaluate`): evidence Recall@K over the questions with evidence, per ability and
overall; a question's evidence is its `source_chat_ids` flattened (nested lists, and the values of the
dicts some abilities use, e.g. knowledge_update's `{original_info, updated_info}`: their union).
Update-first (knowledge_update): in the result at the largest K, the share of questions whose first
ranked memory citing an `updated_info` message comes strictly before the first one citing an
`original_info` message; a question where no updated message appears (or the same memory cites both
first) counts as not first. Latency: warm `retrieve_ms` at the largest K (questions embedded in one
batch beforehand), and the cold first query of each user with the default strategy.
"""
from __future__ import annotations

import gc
import json
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any, Sequence

from threadpoolctl import threadpool_limits

from evaluation.common import evaluate, scratch_store
from evaluation.nightly import bench_nightly
from memory.embed import embedder_for
from memory.errors import ConfigError
from memory.ingest import ingest
from memory.ingest.beam import beam_user, chat_files
from memory.runs import consolidate, open_store
from memory.settings import Settings
from memory.store import Store
from retrieval.context import is_profile
from retrieval.retriever import RetrievalResult, Retriever, UnknownStrategyError
from retrieval.strategies import STRATEGIES

#: the strategies scored when none are named (the settings' default strategy is added)
DEFAULT_STRATEGIES = ("dense", "familiarity", "rfmem", "rfmem-hybrid")
#: the ability whose questions also get update-first
UPDATE = "knowledge_update"
KS = (5, 10)


@dataclass
class Consolidation:
    """What consolidating one scale cost."""

    #: (user, messages consolidated, seconds) per chat (and copy), in consolidation order
    chats: list[tuple[str, int, float]] = field(default_factory=list)
    stages: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    ingest_s: float = 0.0
    model_load_s: float = 0.0
    #: process CPU seconds (every thread) of the consolidations: steadier than wall time on a busy machine
    cpu_s: float = 0.0
    peak_mb: float = 0.0

    @property
    def seconds(self) -> float:
        return sum(s for *_, s in self.chats)

    @property
    def messages(self) -> int:
        return sum(n for _, n, _ in self.chats)


@dataclass
class ScaleResult:
    """The figures of one scale: one row per strategy (see `common.evaluate`, plus `update-first`,
    `uf n`, `uf neither`, `uf tie`), the questions scored, the consolidation cost."""

    scale: str
    chats: list[str]
    questions: list[dict[str, Any]]
    no_evidence: int
    missing_evidence: int
    rows: list[dict[str, Any]]
    cold_ms: list[float]
    #: rows the cold queries' BM25 indexes tokenized (rows without stored terms), of `cold_rows`
    cold_tokenized: int
    cold_rows: int
    consolidation: Consolidation
    default_strategy: str
    memory: dict[str, int]
    peak_mb: float
    #: `evaluation.nightly` lines (with `nightly_users`), else ""
    nightly: str = ""

    @property
    def abilities(self) -> list[str]:
        return sorted({q["ability"] for q in self.questions})


def evidence_ids(source: Any) -> set[str]:
    """Every message id in `source_chat_ids`, as strings: lists nest, dicts contribute their values."""
    if source is None or isinstance(source, bool):
        return set()
    if isinstance(source, dict):
        return set().union(*(evidence_ids(v) for v in source.values()))
    if isinstance(source, (list, tuple)):
        return set().union(*(evidence_ids(v) for v in source))
    return {str(source)}


def load_questions(chat_dir: Path, user: str) -> tuple[list[dict[str, Any]], int]:
    """The chat's questions with evidence (`user`, `question`, `ability`, `evidence`, and for
    knowledge updates `original` / `updated`), and how many had none."""
    path = chat_dir / "probing_questions.json"
    if not path.is_file():
        raise ConfigError(f"{path} is missing: a BEAM chat folder holds chat.json and probing_questions.json",
                          path=str(path))
    out, none = [], 0
    for ability, items in json.loads(path.read_text()).items():
        for item in items:
            source = item.get("source_chat_ids")
            evidence = evidence_ids(source)
            if not evidence or not str(item.get("question", "")).strip():
                none += 1
                continue
            q: dict[str, Any] = {"user": user, "question": item["question"], "ability": ability,
                                 "evidence": evidence}
            if ability == UPDATE and isinstance(source, dict):
                q["original"] = evidence_ids(source.get("original_info"))
                q["updated"] = evidence_ids(source.get("updated_info"))
            out.append(q)
    return out, none


def first_rank(items: Sequence[Any], ids: set[str]) -> int | None:
    """Rank of the first ranked memory (the pinned profile skipped) citing one of `ids`; None if none does."""
    ranked = [it for it in items if not is_profile(it)]
    return next((i for i, it in enumerate(ranked) if ids & set(it.source_ids)), None)


class UpdateFirst:
    """Collects update-first outcomes of knowledge_update questions (an `evaluate` observer)."""

    def __init__(self) -> None:
        self.first = self.after = self.neither = self.tie = 0

    def __call__(self, q: dict[str, Any], res: RetrievalResult) -> None:
        if not q.get("updated"):
            return
        up, orig = first_rank(res.items, q["updated"]), first_rank(res.items, q.get("original", set()))
        if up is None:
            self.neither += orig is None
            self.after += orig is not None
        elif orig is None or up < orig:
            self.first += 1
        elif up == orig:
            self.tie += 1
        else:
            self.after += 1

    @property
    def n(self) -> int:
        return self.first + self.after + self.neither + self.tie

    def row(self) -> dict[str, Any]:
        return {"update-first": self.first / self.n if self.n else float("nan"), "uf n": self.n,
                "uf neither": self.neither, "uf tie": self.tie}


def scale_order(scale: str) -> tuple[float, str]:
    """`100K` < `500K` < `1M` (unknown names last, by name)."""
    unit = {"K": 1e3, "M": 1e6}.get(scale[-1:].upper())
    try:
        return (float(scale[:-1]) * unit, scale) if unit else (float("inf"), scale)
    except ValueError:
        return float("inf"), scale


def scales_in(root: Path) -> list[str]:
    """The scale folders under `root` that hold a chat, smallest first."""
    found = [p.name for p in root.iterdir() if p.is_dir() and any(p.glob("*/chat.json"))] if root.is_dir() else []
    return sorted(found, key=scale_order)


def requested_scales(root: Path, scales: Sequence[str] | None) -> list[str]:
    """The scales to run (default: every scale folder under `root`), each folder checked before any work."""
    todo = list(scales or scales_in(root))
    if not todo:
        raise ConfigError(f"{root} holds no SCALE/N/chat.json folder", path=str(root))
    for scale in todo:
        if not (root / scale).is_dir():
            raise ConfigError(f"no scale folder {root / scale} (found: {', '.join(scales_in(root)) or 'none'})",
                              path=str(root / scale))
    return todo


def scale_chats(root: Path, scale: str) -> list[Path]:
    """The chat files of one scale folder; a `ConfigError` when it holds none."""
    chats = chat_files(root / scale)
    if not chats:
        raise ConfigError(f"{root / scale} holds no N/chat.json folder", path=str(root / scale))
    return chats


def strategy_names(strategies: Sequence[str] | None, default: str) -> list[str]:
    """The strategies to score (the default ones and the settings' default), each known."""
    names = list(dict.fromkeys([*(strategies or DEFAULT_STRATEGIES), default]))
    for name in names:
        if name not in STRATEGIES:
            raise UnknownStrategyError(name)
    return names


def consolidate_scale(st: Store, chats: list[Path], cfg: Settings, copies: int) -> Consolidation:
    """Ingest every chat (and its copies) and consolidate them one user at a time, timed."""
    out = Consolidation()
    t0 = time.perf_counter()
    embedder_for(cfg).embed(["warm up"])
    out.model_load_s = time.perf_counter() - t0
    users: list[str] = []
    t0 = time.perf_counter()
    for chat in chats:
        base = beam_user(chat)
        for i in range(copies):
            user = base if i == 0 else f"{base}-copy{i + 1}"
            ingest(st, chat, "beam", user_id=user)
            users.append(user)
    out.ingest_s = time.perf_counter() - t0
    for user in users:
        cpu = time.process_time()
        report = consolidate(st, cfg, users=[user], kind="bench-beam")
        out.cpu_s += time.process_time() - cpu
        out.chats.append((user, report.counts.get("messages", 0), report.seconds))
        for k, v in report.timings.items():
            out.stages[k] = out.stages.get(k, 0.0) + v
        for k, n in report.counts.items():
            out.counts[k] = out.counts.get(k, 0) + n
    out.peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def run_scale(root: Path, scale: str, store_dir: str, names: list[str], copies: int,
              cfg: Settings, ks: Sequence[int] = KS, nightly_users: int = 0) -> ScaleResult:
    """Consolidate one scale's chats into `store_dir` and score every strategy on them."""
    chats = scale_chats(root, scale)
    cfg = cfg.with_overrides(store=store_dir, llm="rules")
    st = open_store(cfg)
    cons = consolidate_scale(st, chats, cfg, copies)
    questions: list[dict[str, Any]] = []
    no_evidence = missing = 0
    for chat in chats:
        user = beam_user(chat)
        qs, none = load_questions(chat.parent, user)
        stored = set(st.read("messages", user, columns=["message_id"]).column("message_id").to_pylist())
        missing += sum(len(q["evidence"] - stored) for q in qs)
        questions += qs
        no_evidence += none
    r = Retriever(st, cfg)
    vecs = r.embed([q["question"] for q in questions])
    gc.collect()
    gc.freeze()      # as `mnemo serve` does once loaded: no full collection of the model's objects mid-query
    with threadpool_limits(limits=1, user_api="blas"):   # single-threaded BLAS, as `mnemo serve` runs
        default = r.settings.default_strategy
        first: dict[str, int] = {}
        for i, q in enumerate(questions):
            first.setdefault(q["user"], i)
        cold, tokenized, indexed = [], 0, 0
        for user, i in first.items():  # the first query of each user builds its index
            res = r.retrieve(user, vecs[i], k=max(ks), strategy=default, text=questions[i]["question"])
            cold.append(res.signals["timings"]["retrieve_ms"])
            idx = r.user_index(user)
            tokenized += idx.lexical(r.settings.bm25_k1, r.settings.bm25_b).tokenized
            indexed += idx.size
            for name in names:  # warm every strategy's caches before timing
                r.retrieve(user, vecs[i], k=max(ks), strategy=name, text=questions[i]["question"])
        abilities = sorted({q["ability"] for q in questions})
        rows = []
        for name in names:
            uf = UpdateFirst()
            row = evaluate(r, questions, vecs, name, ks, groups=abilities, key="ability", observe=uf)
            rows.append({**row, **uf.row()})
    memory = {t: sum(st.count_by_user(t).values()) for t in ("messages", "fragments", "insights", "topics",
                                                               "summaries")}
    return ScaleResult(scale=scale, chats=[beam_user(c) for c in chats], questions=questions,
                       no_evidence=no_evidence, missing_evidence=missing, rows=rows, cold_ms=cold,
                       cold_tokenized=tokenized, cold_rows=indexed,
                       consolidation=cons, default_strategy=default, memory=memory,
                       peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                       nightly=bench_nightly(st, nightly_users, cfg) if nightly_users else "")


def iter_beam(path: str, *, scales: Sequence[str] | None = None, strategies: Sequence[str] | None = None,
              copies: int = 1, store: str | None = None, settings: Settings | None = None,
              nightly_users: int = 0) -> Iterator[ScaleResult]:
    """Every requested scale (default: every scale folder under `path`), smallest first, each in its
    own store: `store/SCALE` when `store` is given (chats already consolidated there then cost
    nothing), else a temporary one. Arguments are checked before the first scale starts."""
    root = Path(path)
    cfg = settings or Settings()
    if copies < 1:
        raise ConfigError(f"--users-copies must be at least 1, got {copies}", copies=copies)
    todo = requested_scales(root, scales)
    names = strategy_names(strategies, cfg.retrieval.default_strategy)
    return _scales(root, todo, names, copies, store, cfg, nightly_users)


def _scales(root: Path, todo: list[str], names: list[str], copies: int, store: str | None,
            cfg: Settings, nightly_users: int = 0) -> Iterator[ScaleResult]:
    for scale in todo:
        with scratch_store(str(Path(store) / scale) if store else None, f"mnemo-beam-{scale}-") as st_dir:
            yield run_scale(root, scale, st_dir, names, copies, cfg, nightly_users=nightly_users)


def run_beam(path: str, *, scales: Sequence[str] | None = None, strategies: Sequence[str] | None = None,
             copies: int = 1, store: str | None = None, settings: Settings | None = None) -> list[ScaleResult]:
    """The results of every scale (see `iter_beam`)."""
    return list(iter_beam(path, scales=scales, strategies=strategies, copies=copies, store=store,
                          settings=settings))


def beam_reports(path: str, *, scales: Sequence[str] | None = None, strategies: Sequence[str] | None = None,
                 copies: int = 1, store: str | None = None, settings: Settings | None = None,
                 nightly_users: int = 0) -> Iterator[str]:
    """The printed report of each scale as soon as it is measured (see `iter_beam`)."""
    anchors = Path(path) / "ANCHORS.md"
    for res in iter_beam(path, scales=scales, strategies=strategies, copies=copies, store=store,
                         settings=settings, nightly_users=nightly_users):
        yield report(res, anchors, copies)


def bench_beam(path: str, *, scales: Sequence[str] | None = None, strategies: Sequence[str] | None = None,
               copies: int = 1, store: str | None = None, settings: Settings | None = None) -> str:
    """Run the benchmark (see `iter_beam`) and format one report per scale."""
    return "\n\n".join(beam_reports(path, scales=scales, strategies=strategies, copies=copies, store=store,
                                     settings=settings))


def short(ability: str) -> str:
    """`knowledge_update` -> `KU`."""
    return "".join(w[0] for w in ability.split("_")).upper()


def table(res: ScaleResult, ks: Sequence[int] = KS) -> str:
    """One Markdown row per strategy: R@{max K} per ability, overall R@K, update-first, latency."""
    k = max(ks)
    head = ["strategy"] + [f"{short(a)} R@{k}" for a in res.abilities] + [f"R@{x}" for x in ks] + [
        "update-first", "p50 ms", "p99 ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in res.rows:
        name = row["strategy"] + (" (default)" if row["strategy"] == res.default_strategy else "")
        cells = [name] + [f"{row[f'R@{k} c{a}']:.3f}" for a in res.abilities] + [f"{row[f'R@{x}']:.3f}" for x in ks]
        cells += [f"{row['update-first']:.3f}", f"{row['p50 ms']:.2f}", f"{row['p99 ms']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_message(seconds: float, messages: int, digits: int = 1) -> str:
    """Milliseconds per message; "n/a" with none consolidated (a reused store's seconds are no cost)."""
    return f"{1000 * seconds / messages:.{digits}f}" if messages else "n/a"


def consolidation_lines(c: Consolidation) -> list[str]:
    """Seconds per chat, per message and per stage; peak memory."""
    n, secs = max(1, len(c.chats)), [s for *_, s in c.chats]
    total_stages = sum(c.stages.values()) or 1e-9
    stages = ", ".join(f"{k} {v:.1f}s ({100 * v / total_stages:.0f}%)" for k, v in c.stages.items())
    per_chat = "; ".join(f"{u} {m} msg {s:.1f}s ({per_message(s, m, 0)} ms/msg)" for u, m, s in c.chats)
    return [f"consolidation: {len(c.chats)} chats, {c.messages} messages, {c.seconds:.1f} s = "
            f"{c.seconds / n:.1f} s/chat (min {min(secs, default=0):.1f}, max {max(secs, default=0):.1f}), "
            f"{per_message(c.seconds, c.messages)} ms/message; ingest {c.ingest_s:.1f} s, "
            f"model load {c.model_load_s:.1f} s (both before the clock); process CPU {c.cpu_s:.1f} s = "
            f"{per_message(c.cpu_s, c.messages)} ms/message",
            f"stages: {stages or 'none (already consolidated)'}",
            f"per chat: {per_chat}",
            f"peak RSS after consolidation {c.peak_mb:.0f} MiB (process max so far)"]


def anchor_lines(anchors: Path, scale: str) -> list[str]:
    """The raw-message anchors' table for `scale` from ANCHORS.md (its `## SCALE ...` section), if any."""
    if not anchors.is_file():
        return []
    out, inside = [], False
    for line in anchors.read_text().splitlines():
        if line.startswith("## "):
            inside = line[3:].startswith(scale + " ")
        elif inside and line.startswith("|"):
            out.append(line)
    head = f"anchors (raw messages, no mnemo; per ability in {anchors}):"
    return [head, *out] if out else [f"anchors: none for {scale} in {anchors}"]


def report(res: ScaleResult, anchors: Path, copies: int = 1) -> str:
    """The printed figures of one scale."""
    counts = {a: sum(q["ability"] == a for q in res.questions) for a in res.abilities}
    uf = res.rows[0]
    cold = res.cold_ms
    lines = [f"BEAM {res.scale}: {len(res.chats)} chats" + (f" x {copies} user copies" if copies > 1 else "")
             + f", {len(res.questions)} questions with evidence ({res.no_evidence} without, not scored), "
             f"memory {res.memory}, default strategy {res.default_strategy}",
             "abilities (R@10 columns): " + ", ".join(f"{short(a)}={a} ({n})" for a, n in counts.items()),
             f"update-first: {UPDATE} at k={max(KS)}, {uf['uf n']} questions; a question where no updated "
             "message is in the top k (or one memory cites both first) counts as not first "
             "(neither/tie per strategy: " + ", ".join(f"{r['strategy']} {r['uf neither']}/{r['uf tie']}"
                                                       for r in res.rows) + ")",
             "dense = top-K over raw messages; latency = warm retrieve_ms at k=10 (questions embedded beforehand)"]
    if res.missing_evidence:
        lines.append(f"WARNING: {res.missing_evidence} evidence ids are not stored messages")
    lines += ["", table(res), ""]
    lines += [f"cold first query ({res.default_strategy}) over {len(cold)} users: median "
              f"{median(cold) if cold else float('nan'):.1f} ms, max {max(cold, default=float('nan')):.1f} ms "
              f"(BM25 terms tokenized for {res.cold_tokenized} of {res.cold_rows} rows, read stored for the rest)"]
    lines += consolidation_lines(res.consolidation)
    lines += [f"peak RSS after retrieval {res.peak_mb:.0f} MiB"] + ([res.nightly] if res.nightly else []) + [""]
    lines += anchor_lines(anchors, res.scale)
    return "\n".join(lines)
