"""One user's searchable memory, loaded once from LanceDB and cached by table versions.

A `UserIndex` holds the unit vectors of every searchable row (the tables of
`schemas.MEMORY_TABLES`: messages with a vector, fragments, insights, summaries, topics) as one
float32 matrix, the rows' metadata as one Arrow table (materialized only for the items a query
returns), and, built on first use, the BM25 index, the per-user gate calibration and the graph.

Every index is one snapshot: each table it reads (`TRACKED`: the memory tables and the graph's) is
read at the version of the cache's current snapshot (`Store.read(version=...)`), never at whatever
is latest when the read happens, so an index never mixes a table before a write with another after
it; the snapshot itself is `Store.snapshot`, which never stops inside a multi-table unit (a shard
commit, a forget: `memory.units`). The index keeps, per table, a digest of its rows' physical addresses (`_rowaddr`, which changes
whenever a row is inserted, rewritten or deleted).

`IndexCache` re-reads the table versions at most every `refresh_ms`. When tables moved, a cached
user is checked on its next request: one address-only read of its rows per moved table; a user
whose rows are all where they were keeps its index (the same object, its memos intact), a user a
write touched gets a new index, built in full and then put in place in one step (requests for that
user wait for the one build; other users are never held up).
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memory import schemas
from memory.errors import StoreError, VersionGoneError
from memory.ids import validate_user_id
from memory.store import Store
from memory.terms import message_text
from retrieval.forgotten import ForgetWatch
from retrieval.lexical import BM25Index, warm
from retrieval.times import shown_time

log = logging.getLogger(__name__)

T = TypeVar("T")

META = pa.schema([("id", pa.string()), ("kind", pa.string()), ("text", pa.string()), ("key", pa.string()),
                  ("date", pa.string()), ("source_ids", pa.list_(pa.string())),
                  ("ts", pa.timestamp("us", tz="UTC"))])

#: the tables an index reads (the memory tables, then the graph's, read by the walk on first use)
TRACKED: tuple[str, ...] = tuple(schemas.MEMORY_TABLES.values()) + ("graph_nodes", "graph_edges")
ADDR = "_rowaddr"
#: threads that read a user's tables in parallel and build its BM25 index
_POOL = ThreadPoolExecutor(max_workers=len(schemas.MEMORY_TABLES) + 1, thread_name_prefix="mnemo-index")


def rows_digest(addresses: pa.ChunkedArray | pa.Array) -> bytes:
    """A digest of a set of row addresses (order-free)."""
    arr = addresses.combine_chunks() if isinstance(addresses, pa.ChunkedArray) else addresses
    values = np.sort(arr.to_numpy(zero_copy_only=False).astype(np.uint64))
    return hashlib.blake2b(values.tobytes(), digest_size=16).digest()


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
    #: the snapshot: the version of each `TRACKED` table it was read at (empty: read at the latest)
    versions: tuple[int, ...] = ()
    #: table -> digest of the user's row addresses there, for every table read so far
    digests: dict[str, bytes] = field(default_factory=dict)
    _lexical: BM25Index | None = None
    _extra: dict[str, Any] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)   # a memo may build from another memo

    @property
    def size(self) -> int:
        return int(self.z.shape[0])

    def lexical(self, k1: float, b: float) -> BM25Index:
        """The BM25 index of the rows' texts: built with the index from the stored terms when the cache
        has a lexical channel, else (no lexical weight) tokenized here on first use."""
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

    def turn_rows(self) -> dict[str, int]:
        """message id -> index row of its raw turn, built on first use (validity, turn groups)."""
        def build() -> dict[str, int]:
            rows = np.flatnonzero(self.kinds == "message")
            srcs = self.meta.column("source_ids").take(pa.array(rows, type=pa.int64())).to_pylist()
            return {s[0]: int(r) for r, s in zip(rows.tolist(), srcs) if s}
        return self.memo("turn-rows", build)

    def said_by(self, voices: tuple[str, ...]) -> pa.ChunkedArray:
        """Per turn of `messages`: did one of `voices` (speaker names, case-insensitive) say it? Built
        once per index (the assistant masks of the strategies and of the instruction place)."""
        def build() -> pa.ChunkedArray:
            t = self.messages
            if t.num_rows == 0 or "speaker" not in t.column_names:
                return pa.chunked_array([pa.array([False] * t.num_rows, pa.bool_())])
            return pc.fill_null(pc.is_in(pc.utf8_lower(t.column("speaker")),
                                         value_set=pa.array(sorted({v.lower() for v in voices}))), False)
        return self.memo("said-by:" + ",".join(sorted(voices)), build)

    def said_ids(self, voices: tuple[str, ...]) -> pa.Array:
        """Message ids of the turns one of `voices` said (`said_by`), built once per index (the
        assistant masks of the strategies and of the recall cue)."""
        return self.memo("said-ids:" + ",".join(sorted(voices)), lambda: pc.filter(
            self.messages.column("message_id"), self.said_by(voices)).combine_chunks())

    def turns(self) -> dict[str, str]:
        """message_id -> "speaker: text" of every turn of the user, built on first use."""
        t = self.messages
        return self.memo("turns", lambda: dict(zip(
            t.column("message_id").to_pylist(),
            (f"{s}: {x}" for s, x in zip(t.column("speaker").to_pylist(), t.column("text").to_pylist())))))

    def rows(self, idx: np.ndarray) -> list[dict[str, Any]]:
        return self.meta.take(pa.array(idx, type=pa.int64())).to_pylist()

    def source_ids(self, row: int) -> list[str]:
        """The message ids one row cites."""
        return list(self.meta.column("source_ids")[row].as_py() or [])

    def version_of(self, table: str) -> int | None:
        """The version of `table` this index was read at (None: the latest)."""
        return self.versions[TRACKED.index(table)] if self.versions and table in TRACKED else None

    def read(self, table: str) -> pa.Table:
        """The user's rows of a tracked table at this index's snapshot (the walk's graph); their
        digest is kept, so a later write to them renews the index."""
        if self.store is None:
            raise StoreError(f"the index of user {self.user_id} was not read from a store")
        with self._lock:
            version = self.version_of(table)
            try:
                t = self.store.read(table, self.user_id, version=version)
                addresses = self.store.read(table, self.user_id, columns=[ADDR], version=version)
            except VersionGoneError:     # purged under this index: the latest (the index renews soon)
                t = self.store.read(table, self.user_id)
                addresses = self.store.read(table, self.user_id, columns=[ADDR])
            self.digests[table] = rows_digest(addresses.column(ADDR))
        return t


def _vectors(col: pa.ChunkedArray, dim: int) -> np.ndarray:
    arr = col.combine_chunks()
    if len(arr) == 0:
        return np.zeros((0, dim), dtype=np.float32)
    values = arr.flatten().to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(values.reshape(len(arr), -1), dtype=np.float32)


def _message_meta(t: pa.Table) -> pa.Table:
    n = t.num_rows
    text = message_text(t.column("speaker"), t.column("text"))
    sources = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)),
                                       t.column("message_id").combine_chunks())
    ts = t.column("ts")
    date = shown_time(ts, t.column("utc_offset_min") if "utc_offset_min" in t.column_names else None)
    return pa.table({"id": t.column("id"), "kind": pa.array(["message"] * n, pa.string()), "text": text,
                     "key": pa.nulls(n, pa.string()), "date": date, "source_ids": sources, "ts": ts}, schema=META)


def _memory_meta(t: pa.Table, kind: str) -> pa.Table:
    n = t.num_rows
    return pa.table({"id": t.column("id"), "kind": pa.array([kind] * n, pa.string()), "text": t.column("text"),
                     "key": t.column("key"), "date": t.column("date"), "source_ids": t.column("source_ids"),
                     "ts": t.column("session_ts")}, schema=META)


_META_COLS = {"message": ["id", "message_id", "speaker", "text", "ts", "utc_offset_min"],
              "memory": ["id", "text", "key", "date", "source_ids", "session_ts"]}
#: the fragments' validity columns (retrieval.validity), read with the index's fragments read and kept
#: as the memo `FRAGMENT_VALIDITY`, so the first query does not read the table twice
VALIDITY_COLUMNS = ["valid_from", "valid_until", "superseded_by", "contradicts", "replaces_sources",
                    "contradicts_sources"]
#: what the memo `FRAGMENT_VALIDITY` holds: the fragments' ids and sources with their validity columns
VALIDITY_READ = ["id", "source_ids"] + VALIDITY_COLUMNS
FRAGMENT_VALIDITY = "fragment-validity"


def load_user(store: Store, user_id: str, *, lexical: tuple[float, float] | None = None,
              versions: tuple[int, ...] = ()) -> UserIndex:
    """Read one user's embedded memories of every kind (one scoped read per table, the tables read
    in parallel: LanceDB releases the GIL), each table at its version in `versions` (aligned with
    `TRACKED`; empty: at the latest). With `lexical=(k1, b)` the BM25 index is built in a thread
    while the vectors are converted."""
    start = time.perf_counter()
    user_id = validate_user_id(user_id)
    at = dict(zip(TRACKED, versions))
    kinds_tables = list(schemas.MEMORY_TABLES.items())
    def columns(kind: str) -> list[str]:
        extra = VALIDITY_COLUMNS if kind == "fragment" else []
        stored = [schemas.TERMS] if lexical else []     # read only to build BM25 now
        return _META_COLS["message" if kind == "message" else "memory"] + extra + ["vector", ADDR] + stored
    reads = [_POOL.submit(store.read, table, user_id, version=at.get(table), columns=columns(kind))
             for kind, table in kinds_tables]
    validity: pa.Table | None = None
    metas, tables, digests, terms = [], [], {}, []
    messages = pa.table({"message_id": pa.array([], pa.string()), "speaker": pa.array([], pa.string()),
                         "text": pa.array([], pa.string())})
    for (kind, table), read in zip(kinds_tables, reads):
        t = read.result()
        digests[table] = rows_digest(t.column(ADDR))
        t = t.drop_columns([ADDR])
        if kind == "fragment":
            validity = t.select(VALIDITY_READ)
            t = t.drop_columns(VALIDITY_COLUMNS)
        if kind == "message" and t.num_rows:
            messages = t.select(["message_id", "speaker", "text"])
        if t.column("vector").null_count:
            t = t.filter(pc.is_valid(t.column("vector")))  # turns get vectors when consolidated
        if t.num_rows == 0:
            continue
        metas.append(_message_meta(t) if kind == "message" else _memory_meta(t, kind))
        tables.append(t)
        if lexical:             # null where an older mnemo wrote the row: tokenized then
            terms.append(t.column(schemas.TERMS).combine_chunks())
    meta = pa.concat_tables(metas).combine_chunks() if metas else META.empty_table()
    future = _build_lexical(meta, pa.concat_arrays(terms), lexical) if lexical and terms else None
    vecs = [_vectors(t.column("vector"), store.dim) for t in tables]
    z = np.concatenate(vecs) if vecs else np.zeros((0, store.dim), dtype=np.float32)
    names = [m.column("kind")[0].as_py() for m in metas]
    kinds = np.repeat(np.asarray(names, dtype=str), [m.num_rows for m in metas]) if metas \
        else np.zeros(0, dtype=str)
    idx = UserIndex(user_id=user_id, z=z, meta=meta, kinds=kinds, messages=messages, store=store,
                    versions=tuple(versions), digests=digests)
    if validity is not None:
        valid: pa.Table = validity
        idx.memo(FRAGMENT_VALIDITY, lambda: valid)
    if future is not None:
        idx._lexical = future.result()
    idx.load_ms = (time.perf_counter() - start) * 1000
    log.debug("loaded %d memories of user %s in %.1f ms", len(kinds), user_id, idx.load_ms)
    return idx


def unchanged(store: Store, index: UserIndex, versions: tuple[int, ...]) -> bool:
    """True when every row of the user that `index` read sits where it sat in every tracked table
    that moved between the index's snapshot and `versions` (one address-only read per such table)."""
    if len(index.versions) != len(TRACKED) or len(versions) != len(TRACKED):
        return False
    for table, old, new in zip(TRACKED, index.versions, versions):
        if old == new or table not in index.digests:
            continue                         # not moved, or never read (the graph before the first walk)
        if new < old:
            return False                     # the table was dropped and made again
        if store.inserts.inserted_only(table, old, new, index.user_id):
            continue                         # only other users' rows were added (appends): none moved
        t = store.read(table, index.user_id, columns=[ADDR], version=new)
        if rows_digest(t.column(ADDR)) != index.digests[table]:
            return False
    return True




def _build_lexical(meta: pa.Table, terms: pa.Array, params: tuple[float, float]) -> Future[BM25Index]:
    k1, b = params
    return _POOL.submit(BM25Index, meta.column("text"), k1=k1, b=b, terms=terms)


#: snapshots `IndexCache.get` reads before a purged version is the caller's error
GONE_RETRIES = 4


class IndexCache:
    """Per-user indexes, LRU-bounded, each one snapshot of the tracked tables; a user is renewed
    when a write touched its rows (see the module doc)."""

    def __init__(self, store: Store, refresh_ms: int = 500, max_users: int = 256,
                 lexical: tuple[float, float] | None = None) -> None:
        self.store = store
        self.lexical = lexical  # (k1, b): build each user's BM25 index while its vectors load
        if lexical:
            warm()
        self.refresh_s = refresh_ms / 1000.0
        self.max_users = max_users
        self._users: OrderedDict[str, UserIndex] = OrderedDict()
        self._versions: tuple[int, ...] | None = None
        self._checked = 0.0
        self._lock = threading.Lock()              # the dict, the snapshot
        self._check_lock = threading.Lock()        # one thread reads the versions at a time
        self._building: dict[str, list[Any]] = {}  # user -> [lock, waiters]: one build per user
        self._forgets = ForgetWatch(store)         # users forgotten by any process leave the cache
        try:                  # open the tables now, not in the first query (a sixth of a cold one)
            self.versions()   # the first query still reads the versions afresh
            self._forgets.touched()
        except StoreError as exc:
            log.warning("could not open the store's tables yet (%s): the first query will", exc)

    def versions(self) -> tuple[int, ...]:
        """Version of every tracked table (0 when missing) to pin: the latest, but never half of a
        multi-table unit (a shard commit, a forget: `Store.snapshot`)."""
        pinned = self.store.snapshot(TRACKED)
        return tuple(pinned[name] for name in TRACKED)

    def check(self, force: bool = False) -> tuple[int, ...]:
        """The current snapshot: the versions re-read when `refresh_ms` passed (or `force`)."""
        with self._lock:
            if not force and self._versions is not None and time.monotonic() - self._checked < self.refresh_s:
                return self._versions
        with self._check_lock:                     # reads in order: versions never seem to go back
            now = time.monotonic()
            with self._lock:
                if not force and self._versions is not None and now - self._checked < self.refresh_s:
                    return self._versions
            current = self.versions()
            moved = self._versions is not None and current != self._versions
            gone = self._forgets.touched() if moved else set()
            with self._lock:
                if moved:
                    log.debug("tables moved %s -> %s: users are checked on their next request",
                              self._versions, current)
                for user in gone:      # forgotten elsewhere: their texts leave memory now
                    self._users.pop(user, None)
                self._versions, self._checked = current, now
                return current

    def get(self, user_id: str) -> UserIndex:
        """The user's index at the current snapshot; when a version it pinned was cleaned up meanwhile
        (a forget's purge, a compaction), the snapshot is re-read and the index built again, up to
        `GONE_RETRIES` times (a forget that purges after every write can take the re-read one too)."""
        tries = 1
        while True:
            try:
                return self._get(user_id)
            except VersionGoneError as exc:
                if tries >= GONE_RETRIES:
                    raise
                tries += 1
                log.info("pinned version gone (%s): re-reading the snapshot", exc)
                self.check(force=True)

    def _get(self, user_id: str) -> UserIndex:
        snapshot = self.check()
        with self._lock:
            idx = self._users.get(user_id)
            if idx is not None and idx.versions == snapshot:
                self._users.move_to_end(user_id)
                return idx
        with self._build_lock(user_id):
            with self._lock:
                snapshot = self._versions or snapshot      # the newest (it may have moved meanwhile)
                idx = self._users.get(user_id)
            if idx is not None and idx.versions != snapshot:
                with idx._lock:                              # no graph read half done
                    if unchanged(self.store, idx, snapshot):
                        idx.versions = snapshot             # the same rows: keep the index and its memos
                    else:
                        idx = None
            if idx is None:
                idx = load_user(self.store, user_id, lexical=self.lexical, versions=snapshot)
            with self._lock:                                 # the swap: one assignment
                self._users[user_id] = idx
                self._users.move_to_end(user_id)
                while len(self._users) > self.max_users:
                    self._users.popitem(last=False)
            return idx

    @contextmanager
    def _build_lock(self, user_id: str) -> Iterator[None]:
        with self._lock:
            entry = self._building.setdefault(user_id, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._lock:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._building[user_id]

    def cached(self) -> list[str]:
        """The users whose index is held, least recently used first."""
        with self._lock:
            return list(self._users)

    def evict(self, user_id: str) -> None:
        """Drop the user's index (after a forget in this process: its texts leave memory now, not
        on the user's next request)."""
        with self._lock:
            self._users.pop(user_id, None)
            self._checked = float("-inf")     # the next query reads the versions the forget wrote

    def clear(self) -> None:
        with self._lock:
            self._users.clear()
            self._versions = None
