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
first) counts as not first. A question whose `updated_info` messages are all `original_info` ones too
can never be first (every memory citing one cites both): it counts as not first in that share, as the
issue defines it, and as *undecidable*; the share over the decidable questions is printed beside it.
Latency: warm `retrieve_ms` at the largest K (questions embedded in one batch beforehand), with the
number of timed queries, and the cold first query of each user with the default strategy. The memory
counts are those of the chats' own users (copies counted apart). The report is `evaluation.beam_report`.
"""
from __future__ import annotations

import gc
import json
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from threadpoolctl import threadpool_limits

from evaluation.common import evaluate, first_of_each_user, scratch_store, warm_up
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
    """The figures of one scale: one row per strategy (see `common.evaluate`, plus `UpdateFirst.row`),
    the questions scored, the consolidation cost."""

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
    #: rows per memory table of the chats' own users (the ones asked)
    memory: dict[str, int]
    peak_mb: float
    #: the same of their copies (`copies` > 1), empty without
    copies_memory: dict[str, int] = field(default_factory=dict)
    #: whether validity ordering was on (`retrieval.validity`): it pulls memories into every strategy's result
    validity: bool = True
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


def undecidable(q: dict[str, Any]) -> bool:
    """A knowledge update whose updated messages are all original ones too (BEAM names one message for
    both): every memory citing an updated message cites an original one, so updated is never first."""
    return bool(q.get("updated")) and q["updated"] <= q.get("original", set())


def first_rank(items: Sequence[Any], ids: set[str]) -> int | None:
    """Rank of the first ranked memory (the pinned profile skipped) citing one of `ids`; None if none does."""
    ranked = [it for it in items if not is_profile(it)]
    return next((i for i, it in enumerate(ranked) if ids & set(it.source_ids)), None)


class UpdateFirst:
    """Collects update-first outcomes of knowledge_update questions (an `evaluate` observer), and how
    many of them are `undecidable` (counted in the outcomes too: the share is the issue's)."""

    def __init__(self) -> None:
        self.first = self.after = self.neither = self.tie = self.undecidable = 0

    def __call__(self, q: dict[str, Any], res: RetrievalResult) -> None:
        if not q.get("updated"):
            return
        self.undecidable += undecidable(q)
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
        """`update-first` over every question, `uf decidable` over the decidable ones (nan: none)."""
        decidable = self.n - self.undecidable
        return {"update-first": self.first / self.n if self.n else float("nan"), "uf n": self.n,
                "uf neither": self.neither, "uf tie": self.tie, "uf undecidable": self.undecidable,
                "uf decidable": self.first / decidable if decidable else float("nan")}


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
        cold, tokenized, indexed = [], 0, 0
        for user, i in first_of_each_user(questions).items():  # a user's first query builds its index
            res = r.retrieve(user, vecs[i], k=max(ks), strategy=default, text=questions[i]["question"])
            cold.append(res.signals["timings"]["retrieve_ms"])
            idx = r.user_index(user)
            tokenized += idx.lexical(r.settings.bm25_k1, r.settings.bm25_b).tokenized
            indexed += idx.size
        warm_up(r, questions, vecs, max(ks), names)    # every strategy's caches warm before timing
        abilities = sorted({q["ability"] for q in questions})
        rows = []
        for name in names:
            uf = UpdateFirst()
            row = evaluate(r, questions, vecs, name, ks, groups=abilities, key="ability", observe=uf)
            rows.append({**row, **uf.row()})
    asked = [beam_user(c) for c in chats]
    copies_of = [u for u, *_ in cons.chats if u not in asked]
    return ScaleResult(scale=scale, chats=asked, questions=questions,
                       no_evidence=no_evidence, missing_evidence=missing, rows=rows, cold_ms=cold,
                       cold_tokenized=tokenized, cold_rows=indexed,
                       consolidation=cons, default_strategy=default, memory=memory_counts(st, asked),
                       copies_memory=memory_counts(st, copies_of) if copies_of else {},
                       validity=r.settings.validity,
                       peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                       nightly=bench_nightly(st, nightly_users, cfg) if nightly_users else "")


def memory_counts(st: Store, users: Sequence[str]) -> dict[str, int]:
    """Rows per memory table of `users` only (a reused store may hold other users and chats)."""
    out = {}
    for table in ("messages", "fragments", "insights", "topics", "summaries"):
        per_user = st.count_by_user(table)
        out[table] = sum(per_user.get(u, 0) for u in users)
    return out


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
