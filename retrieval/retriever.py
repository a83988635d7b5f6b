"""The online retriever: `Retriever.open(store).retrieve(user_id, query, k, strategy)`.

Read-only over the store. A user's memories are loaded once and cached by table versions
(`retrieval.index`); every strategy then runs in NumPy. Query embedding is timed apart from
retrieval (`signals["timings"]["embed_ms"]` vs `retrieve_ms`).
"""
from __future__ import annotations

import logging
import numbers
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from memory.embed import Embedder, check_vectors_match, embedder_for, recorded_embedder
from memory.errors import ConfigError
from memory.ids import validate_user_id
from memory.schemas import MEMORY_TABLES
from memory.settings import RetrievalSettings, Settings, kinds_problem
from memory.store import Store
from retrieval.context import fit_context
from retrieval.feedback import FeedbackLog
from retrieval.index import IndexCache, UserIndex
from retrieval.instructions import pin_instruction
from retrieval.rerank.model import GLOBAL, Reranker, RerankerCache, scope_key
from retrieval.strategies import STRATEGIES, Query, novel_order, profile_row
from retrieval.validity import annotate, asks_history, order_current

log = logging.getLogger(__name__)


class UnknownStrategyError(ConfigError):
    """A strategy name no registry knows."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown retrieval strategy: {name!r} (known: {', '.join(STRATEGIES)})",
                         name=name, known=list(STRATEGIES))


class InvalidQueryError(ConfigError):
    """A query the retriever cannot rank for: blank text, a query vector with no direction (zero,
    NaN, infinite), or memory kinds no table holds."""

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message, **context)


def check_kinds(kinds: Sequence[str] | None) -> tuple[str, ...] | None:
    """The searched kinds as a tuple (None: the settings' kinds); raises InvalidQueryError for an
    empty list or a kind no memory table holds, naming the known kinds."""
    if kinds is None:
        return None
    if isinstance(kinds, str):
        kinds = [kinds]
    asked = tuple(kinds)
    if problem := kinds_problem(asked):
        raise InvalidQueryError(problem, kinds=[k for k in asked if k not in MEMORY_TABLES][:20],
                                known=list(MEMORY_TABLES))
    return asked


@dataclass
class RetrievedItem:
    """One ranked memory; `source_ids` are the message ids it came from."""

    id: str
    kind: str
    text: str
    score: float
    date: str | None
    source_ids: list[str]
    key: str | None = None
    ts: str | None = None
    #: validity (fragments; retrieval.validity): when it became true, when and by what it was replaced
    valid_from: str | None = None
    valid_until: str | None = None
    superseded_by: str | None = None
    #: the versions it replaced, newest first: [{"id", "text", "date"}]
    history: list[dict[str, str]] | None = None
    #: a memory it contradicts without replacing it: {"id", "text", "date"}
    contradiction: dict[str, str] | None = None
    #: further memories it contradicts, the same way (a turn that denies what it states and what
    #: another turn says)
    also_contradicts: list[dict[str, str]] | None = None
    #: a raw turn holding a value a newer memory replaced, or a memory (insight, topic, summary) citing
    #: one: that memory's current version {"id", "text", "date"}
    updated_by: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RetrievalResult:
    """Ranked items, the route the strategy took and the signals it measured."""

    user_id: str
    query: str | None
    strategy: str
    k: int
    items: list[RetrievedItem] = field(default_factory=list)
    route: str | None = None
    signals: dict[str, Any] = field(default_factory=dict)
    #: the user's MemWeaver global profile, when consolidation wrote one (context, not ranked evidence)
    profile: RetrievedItem | None = None
    #: no item cites only messages that items above it already cite (the hybrid strategies, the walk)
    deduped: bool = False
    #: the token budget of `context()` when it is given none (`RetrievalSettings.context_tokens`)
    context_tokens: int = 1500

    @property
    def ids(self) -> list[str]:
        return [it.id for it in self.items]

    def context(self, max_tokens: int | None = None) -> str:
        """Prompt-ready memory text: chronological, dated, within `max_tokens` (None: the setting
        `context_tokens`; see context.py)."""
        return self.context_shown(max_tokens)[0]

    def context_shown(self, max_tokens: int | None = None) -> tuple[str, list[str]]:
        """`context()` and the ids of the memories it shows (not those cut by the budget)."""
        max_tokens = self.context_tokens if max_tokens is None else max_tokens
        if max_tokens < 1:
            raise ConfigError(f"max_tokens must be at least 1, got {max_tokens}", max_tokens=max_tokens)
        return fit_context(self.items, max_tokens=max_tokens, profile=self.profile)

    def to_dict(self) -> dict[str, Any]:
        return {"user_id": self.user_id, "query": self.query, "strategy": self.strategy, "k": self.k,
                "route": self.route, "deduped": self.deduped, "signals": self.signals, "items": [it.to_dict() for it in self.items],
                "profile": self.profile.to_dict() if self.profile else None}


class Retriever:
    """Retrieval over one store; thread-safe; one instance per process is enough.

    `settings` is the whole `Settings` (its `retrieval` section configures the retriever, the rest
    picks the embedder) or the `RetrievalSettings` section alone (the embedder is then the default
    one for the store); None means the defaults. `r.settings` is the retrieval section."""

    def __init__(self, store: Store, settings: Settings | RetrievalSettings | None = None,
                 embedder: Embedder | None = None) -> None:
        self.store = store
        self._mnemo = settings if isinstance(settings, Settings) else None
        self.settings: RetrievalSettings = (settings.retrieval if isinstance(settings, Settings)
                                            else settings or RetrievalSettings())
        self._embedder = embedder
        s = self.settings
        self.cache = IndexCache(store, s.refresh_ms,
                                lexical=(s.bm25_k1, s.bm25_b) if s.lexical_weight > 0 else None)
        self._rerankers = RerankerCache(store, s.refresh_ms)
        self._feedback = FeedbackLog(store)
        self._explore_rng = np.random.default_rng(s.rerank_seed)   # Gumbel noise of `rerank_explore`
        self._explore_lock = threading.Lock()
        self._warned_no_reranker = False
        self._embedder_ok = False           # the store's recorded embedder matched (`check_embedder`)
        self._embedder_next_check = 0.0
        if self.settings.default_strategy not in STRATEGIES:
            raise UnknownStrategyError(self.settings.default_strategy)
        check_kinds(self.settings.kinds)   # settings copied with `model_copy(update=...)` skip their validators

    @classmethod
    def open(cls, store: str | Store, settings: Settings | None = None, *,
             embedder: Embedder | None = None) -> "Retriever":
        """A retriever over a store path / URI (or an open Store), with the embedder `settings` name
        (default: the store's default embedder)."""
        if isinstance(store, Store):
            return cls(store, settings, embedder)
        settings = settings or Settings(store=str(store))
        if embedder is None:
            embedder = embedder_for(settings)
        r = cls(Store(str(store), dim=embedder.dim, consistency_s=None), settings, embedder)
        r.check_embedder()   # queries embedded otherwise would not be comparable
        return r

    def check_embedder(self) -> None:
        """Raise EmbedderMismatchError when the store's vectors were written by another embedder than
        the one that embeds this retriever's queries. Until a consolidation records one (a service
        started on a new store), checked again at most every `refresh_ms`; once it matched, never."""
        if self._embedder_ok or time.monotonic() < self._embedder_next_check:
            return
        recorded = recorded_embedder(self.store)
        if recorded is None:
            self._embedder_next_check = time.monotonic() + self.settings.refresh_ms / 1000
            return
        check_vectors_match(recorded, self.embedder)
        self._embedder_ok = True

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = embedder_for(self._mnemo or Settings(store=self.store.uri))
        return self._embedder

    @property
    def strategies(self) -> list[str]:
        return list(STRATEGIES)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-normalized float32 rows from the store's embedder."""
        return self.embedder.embed(list(texts))

    def user_index(self, user_id: str) -> UserIndex:
        return self.cache.get(validate_user_id(user_id))

    def retrieve(self, user_id: str, query: str | np.ndarray | Sequence[float], k: int | None = None,
                 strategy: str | None = None, *, kinds: Sequence[str] | None = None,
                 text: str | None = None, rerank: bool | None = None) -> RetrievalResult:
        """Rank one user's memories for a query (text, or a precomputed vector plus optional `text`
        for the lexical channel). Unknown users get no items; other users' rows are never read.
        `strategy` None means `settings.default_strategy` (an empty or unknown name raises
        UnknownStrategyError); `kinds` None the settings' kinds (an empty list or an unknown kind
        raises InvalidQueryError, as does a blank text query or a zero or non-finite vector); `k`
        None the settings' k (a bool, a float or a value out of 1..max_k raises ConfigError).

        `rerank` (default: settings.rerank) applies the latest RMM reranker: the strategy's top
        `rerank_top_k` candidates are re-scored and the top k (default `rerank_top_m`) returned;
        fewer when the strategy deduplicates sources and reordering left some candidates covered."""
        user_id = validate_user_id(user_id)
        s = self.settings
        name = s.default_strategy if strategy is None else strategy
        fn = STRATEGIES.get(name)
        if fn is None:
            raise UnknownStrategyError(name)
        searched = check_kinds(kinds)
        if isinstance(query, str) and not query.strip():
            raise InvalidQueryError("the query is blank (empty or whitespace only)", user_id=user_id)
        if isinstance(query, str) and not query.isascii():
            try:
                query.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidQueryError("the query holds a lone surrogate: not Unicode text", user_id=user_id) from None
        do_rerank = s.rerank if rerank is None else bool(rerank)
        if k is not None and (isinstance(k, bool) or not isinstance(k, numbers.Integral)):
            raise ConfigError(f"k must be a whole number, got {k!r}", k=repr(k)[:40])
        k = int(k if k is not None else (s.rerank_top_m if do_rerank else s.k))
        if not 1 <= k <= s.max_k:
            raise ConfigError(f"k must be between 1 and {s.max_k}, got {k}", k=k)
        timings: dict[str, float] = {}
        if isinstance(query, str):
            text = query
            self.check_embedder()
            t0 = time.perf_counter()
            vec = self.embed([query])[0]
            timings["embed_ms"] = (time.perf_counter() - t0) * 1000
        else:
            vec = np.asarray(query, dtype=np.float32).ravel()
            norm = float(np.linalg.norm(vec))     # NaN or inf when the vector holds one (or overflows)
            if not np.isfinite(norm) or norm == 0.0:
                what = "has zero length (empty or all zeros)" if norm == 0.0 else \
                    "holds NaN or infinite values (or overflows float32)"
                raise InvalidQueryError(f"the query vector {what}: it has no direction to rank by; pass the "
                                        "query's embedding (or its text)", user_id=user_id)
            vec = vec / norm
        start = time.perf_counter()
        index = self.cache.get(user_id)
        timings["load_ms"] = (time.perf_counter() - start) * 1000
        result = RetrievalResult(user_id=user_id, query=text, strategy=name, k=k,
                                 context_tokens=self.settings.context_tokens)
        if index.size == 0:
            timings["retrieve_ms"] = (time.perf_counter() - start) * 1000
            result.signals = {"memories": 0, "timings": _round(timings)}
            return result
        if vec.shape[0] != index.z.shape[1]:
            raise ConfigError(f"query vector has {vec.shape[0]} dimensions, the store {index.z.shape[1]}")
        q = Query(index=index, vector=vec, text=text, k=max(k, s.rerank_top_k) if do_rerank else k, settings=s,
                  kinds=searched or tuple(s.kinds))
        rows, scores, route = fn(q)
        if do_rerank:
            rows, scores = self._rerank(user_id, index, vec, rows, scores, k, q.signals, timings,
                                        dedupe=q.deduped)
        history = asks_history(text)
        if s.validity:
            rows, scores, moved = order_current(index, rows, scores, vec, k, history=history, kinds=q.kinds)
            q.signals.update(moved)
        rows, scores = pin_instruction(index, rows, scores, vec, k, s, q.kinds, q.signals, history=history)
        result.route = route
        result.deduped = q.deduped
        result.items = [_item(r, sc) for r, sc in zip(index.rows(rows), scores.tolist())]
        if s.validity:
            looked: dict[str, tuple[str, str]] = {}
            returned = {it.id for it in result.items}
            for it in result.items:
                for name, value in annotate(index, it.id, looked, returned).items():
                    setattr(it, name, value)
        p = index.memo("profile-row", lambda: profile_row(index))
        if p is not None:
            result.profile = _item(index.rows(np.asarray([p], dtype=np.int64))[0], 0.0)
        timings["retrieve_ms"] = (time.perf_counter() - start) * 1000
        result.signals = {"memories": index.size, **q.signals, "timings": _round(timings)}
        return result

    def _rerank(self, user_id: str, index: UserIndex, vec: np.ndarray, rows: np.ndarray, scores: np.ndarray,
                top_m: int, signals: dict[str, Any], timings: dict[str, float], *,
                dedupe: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Top-M of the candidates by the latest reranker (retrieval.rerank); base order without one.
        With `dedupe` a candidate whose every source a higher-reranked one already cites is skipped,
        as the base strategy skipped it in its own order."""
        t0 = time.perf_counter()
        cache = self._rerankers
        model = cache.get(scope_key("user", user_id)) if self.settings.rerank_scope == "user" else None
        model = model or cache.get(GLOBAL)
        explore = self.settings.rerank_explore
        if model is None and explore:
            model = Reranker.identity(vec.shape[0])
        if model is None or model.dim != vec.shape[0]:
            if not self._warned_no_reranker:
                log.warning("rerank asked but no valid reranker version is stored: keeping the base order")
                self._warned_no_reranker = True
            signals["reranker"] = None
            return rows[:top_m], scores[:top_m]
        m = index.z[rows]
        prior = scores.astype(np.float32) - m @ vec
        if explore:
            with self._explore_lock:
                order, sc = model.sample(vec, m, prior, rows.size, self._explore_rng)
        else:
            order, sc = model.rerank(vec, m, prior, rows.size)
        if dedupe:
            sources = index.meta.column("source_ids").take(rows[order]).to_pylist()
            keep = novel_order(sources, np.arange(order.size), top_m)
        else:
            keep = np.arange(min(top_m, order.size))
        order, sc = order[keep], sc[keep]
        timings["rerank_ms"] = (time.perf_counter() - t0) * 1000
        signals["reranker"] = {"version": model.version, "scope": model.scope, "candidates": int(rows.size),
                               "explore": explore}
        return rows[order], sc

    def feedback(self, user_id: str, query: str, shown_ids: Sequence[str], cited_ids: Sequence[str], *,
                 reranker_version: int | None = None) -> dict[str, Any]:
        """Store what the answering LLM was shown for `query` and what it cited (RMM §6.2), after
        checking the ids are retrievable memories of this user and cited ⊆ shown."""
        user_id = validate_user_id(user_id)
        return self._feedback.record(user_id, query, shown_ids, cited_ids,
                                     known_ids=self.cache.get(user_id).row_of_id(),
                                     embed=lambda q: self.embed([q])[0], reranker_version=reranker_version,
                                     max_query_chars=self.settings.max_query_chars)

    def turns(self, user_id: str, message_ids: Sequence[str]) -> dict[str, str]:
        """The original turns ("speaker: text") of message ids of one user (for citation prompts)."""
        turns = self.user_index(user_id).turns()
        return {m: turns[m] for m in message_ids if m in turns}


def _item(r: dict[str, Any], score: float) -> RetrievedItem:
    return RetrievedItem(id=r["id"], kind=r["kind"], text=r["text"] or "", score=round(float(score), 6),
                         date=r["date"], source_ids=list(r["source_ids"] or []), key=r["key"],
                         ts=r["ts"].isoformat() if r["ts"] is not None else None)


def _round(timings: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in timings.items()}
