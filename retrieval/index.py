"""One user's searchable memory, loaded once from LanceDB and cached by table versions.

A `UserIndex` holds the unit vectors of every searchable row (the tables of
`schemas.MEMORY_TABLES`: messages with a vector, fragments, insights, summaries, topics) as one
float32 matrix, the rows' metadata as one Arrow table (materialized only for the items a query
returns), and, built on first use, the BM25 index and the per-user gate calibration. `IndexCache` re-reads table versions at most every
`refresh_ms` and drops every cached user when a memory table moved (consolidation wrote).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memory import schemas
from memory.ids import validate_user_id
from memory.store import Store
from retrieval.lexical import BM25Index

log = logging.getLogger(__name__)

T = TypeVar("T")

META = pa.schema([("id", pa.string()), ("kind", pa.string()), ("text", pa.string()), ("key", pa.string()),
                  ("date", pa.string()), ("source_ids", pa.list_(pa.string())),
                  ("ts", pa.timestamp("us", tz="UTC"))])


@dataclass
class UserIndex:
    """Vectors and metadata of one user's memories, in one row order."""

    user_id: str
    z: np.ndarray
    meta: pa.Table
    kinds: np.ndarray                      # kind name per row (numpy str array)
    messages: pa.Table                     # message_id, speaker, text of every turn
    load_ms: float = 0.0
    store: Store | None = None             # where it was read from (the MemWeaver walk loads its graph)
    _lexical: BM25Index | None = None
    _extra: dict[str, Any] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)   # a memo may build from another memo

    @property
    def size(self) -> int:
        return int(self.z.shape[0])

    def lexical(self, k1: float, b: float) -> BM25Index:
        """The BM25 index of the rows' texts, built on first use."""
        with self._lock:
            if self._lexical is None:
                self._lexical = BM25Index(self.meta.column("text"), k1=k1, b=b)
            return self._lexical

    def memo(self, key: str, build: Callable[[], T]) -> T:
        """A per-user value computed once (calibrations, kind masks, the graph); one key, one type."""
        with self._lock:
            if key not in self._extra:
                self._extra[key] = build()
            value: T = self._extra[key]
            return value

    def row_of_id(self) -> dict[str, int]:
        """memory id -> row, built on first use (feedback validation, reranker candidates, the graph)."""
        return self.memo("row_of_id", lambda: {v: i for i, v in enumerate(self.meta.column("id").to_pylist())})

    def turns(self) -> dict[str, str]:
        """message_id -> "speaker: text" of every turn of the user, built on first use."""
        t = self.messages
        return self.memo("turns", lambda: dict(zip(
            t.column("message_id").to_pylist(),
            (f"{s}: {x}" for s, x in zip(t.column("speaker").to_pylist(), t.column("text").to_pylist())))))

    def rows(self, idx: np.ndarray) -> list[dict[str, Any]]:
        return self.meta.take(pa.array(idx, type=pa.int64())).to_pylist()


def _vectors(col: pa.ChunkedArray, dim: int) -> np.ndarray:
    arr = col.combine_chunks()
    if len(arr) == 0:
        return np.zeros((0, dim), dtype=np.float32)
    values = arr.flatten().to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(values.reshape(len(arr), -1), dtype=np.float32)


def _message_meta(t: pa.Table) -> pa.Table:
    n = t.num_rows
    speaker = pc.fill_null(t.column("speaker"), "")
    text = pc.binary_join_element_wise(speaker, pc.fill_null(t.column("text"), ""), ": ")
    sources = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)),
                                       t.column("message_id").combine_chunks())
    ts = t.column("ts")
    date = pc.strftime(ts, format="%Y-%m-%d %H:%M")
    return pa.table({"id": t.column("id"), "kind": pa.array(["message"] * n, pa.string()), "text": text,
                     "key": pa.nulls(n, pa.string()), "date": date, "source_ids": sources, "ts": ts}, schema=META)


def _memory_meta(t: pa.Table, kind: str) -> pa.Table:
    n = t.num_rows
    return pa.table({"id": t.column("id"), "kind": pa.array([kind] * n, pa.string()), "text": t.column("text"),
                     "key": t.column("key"), "date": t.column("date"), "source_ids": t.column("source_ids"),
                     "ts": t.column("session_ts")}, schema=META)


_META_COLS = {"message": ["id", "message_id", "speaker", "text", "ts"],
              "memory": ["id", "text", "key", "date", "source_ids", "session_ts"]}


def load_user(store: Store, user_id: str, *, lexical: tuple[float, float] | None = None) -> UserIndex:
    """Read one user's embedded memories of every kind (two scoped reads per table).

    Metadata is read first; with `lexical=(k1, b)` the BM25 index is built in a thread (Polars and
    LanceDB release the GIL) while the vectors are read, which is most of a cold query's cost.
    """
    start = time.perf_counter()
    user_id = validate_user_id(user_id)
    metas, tables = [], []
    messages = pa.table({"message_id": pa.array([], pa.string()), "speaker": pa.array([], pa.string()),
                         "text": pa.array([], pa.string())})
    for kind, table in schemas.MEMORY_TABLES.items():
        cols = _META_COLS["message" if kind == "message" else "memory"]
        t = store.read(table, user_id, columns=cols + ["vector"]) if kind == "message" else \
            store.read(table, user_id, columns=cols)
        if kind == "message" and t.num_rows:
            messages = t.select(["message_id", "speaker", "text"])
            t = t.filter(pc.is_valid(t.column("vector")))  # turns get vectors when consolidated
        if t.num_rows == 0:
            continue
        metas.append(_message_meta(t) if kind == "message" else _memory_meta(t, kind))
        tables.append((table, t))
    meta = pa.concat_tables(metas).combine_chunks() if metas else META.empty_table()
    future = _build_lexical(meta, lexical) if lexical and meta.num_rows else None
    vecs = []
    for table, t in tables:
        if table == schemas.MEMORY_TABLES["message"]:
            vecs.append(_vectors(t.column("vector"), store.dim))
            continue
        v = store.read(table, user_id, columns=["id", "vector"])
        order = pc.index_in(t.column("id"), value_set=v.column("id").combine_chunks())
        vecs.append(_vectors(v.column("vector").take(order), store.dim))
    z = np.concatenate(vecs) if vecs else np.zeros((0, store.dim), dtype=np.float32)
    names = [m.column("kind")[0].as_py() for m in metas]
    kinds = np.repeat(np.asarray(names, dtype=str), [m.num_rows for m in metas]) if metas \
        else np.zeros(0, dtype=str)
    idx = UserIndex(user_id=user_id, z=z, meta=meta, kinds=kinds, messages=messages, store=store)
    if future is not None:
        idx._lexical = future.result()
    idx.load_ms = (time.perf_counter() - start) * 1000
    log.debug("loaded %d memories of user %s in %.1f ms", len(kinds), user_id, idx.load_ms)
    return idx


_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="mnemo-bm25")


def _build_lexical(meta: pa.Table, params: tuple[float, float]) -> Future[BM25Index]:
    k1, b = params
    return _POOL.submit(BM25Index, meta.column("text"), k1=k1, b=b)


class IndexCache:
    """Per-user indexes, LRU-bounded, valid while the memory tables keep their versions."""

    def __init__(self, store: Store, refresh_ms: int = 500, max_users: int = 256,
                 lexical: tuple[float, float] | None = None) -> None:
        self.store = store
        self.lexical = lexical  # (k1, b): build each user's BM25 index while its vectors load
        self.refresh_s = refresh_ms / 1000.0
        self.max_users = max_users
        self._users: OrderedDict[str, UserIndex] = OrderedDict()
        self._versions: tuple[int, ...] | None = None
        self._checked = 0.0
        self._lock = threading.Lock()

    def versions(self) -> tuple[int, ...]:
        """Latest version of every memory table (0 when missing)."""
        return tuple(self.store.version(name) for name in schemas.MEMORY_TABLES.values())

    def check(self, force: bool = False) -> None:
        """Re-read table versions when `refresh_ms` passed; drop every user when one moved."""
        now = time.monotonic()
        if not force and self._versions is not None and now - self._checked < self.refresh_s:
            return
        current = self.versions()
        with self._lock:
            self._checked = now
            if current != self._versions:
                if self._versions is not None:
                    log.info("memory tables changed %s -> %s: reloading users", self._versions, current)
                self._versions = current
                self._users.clear()

    def get(self, user_id: str) -> UserIndex:
        self.check()
        with self._lock:
            idx = self._users.get(user_id)
            if idx is not None:
                self._users.move_to_end(user_id)
                return idx
        idx = load_user(self.store, user_id, lexical=self.lexical)
        with self._lock:
            self._users[user_id] = idx
            while len(self._users) > self.max_users:
                self._users.popitem(last=False)
        return idx

    def clear(self) -> None:
        with self._lock:
            self._users.clear()
            self._versions = None
