"""The LanceDB store: opening tables, scoped reads and idempotent upserts.

Every user-scoped read goes through a typed filter (`lancedb.expr`) on a validated user id, so
no value is interpolated into SQL. A read can name a table version (a snapshot: readers that must
see several tables as they were at one moment pin each to a version, through a small cache of
handles checked out at those versions). Writes are `merge_insert` upserts on the deterministic `id`,
de-duplicated per batch, each under the store's writer lease (`memory.lease`: one writer per store
across processes; concurrent merge_insert of the same new key duplicates upstream, lancedb#2463).
Several writes that readers must see together or not at all are one `unit()` (`memory.units`);
readers pin their versions with `snapshot()`.
"""
from __future__ import annotations

import logging
import threading
import warnings
from collections import OrderedDict
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from typing import Any, Iterable, Iterator, TypeAlias

import lancedb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from lancedb.expr import Expr, col, lit

from memory import schemas, terms, units
from memory.errors import StoreBusyError, StoreError, VersionGoneError
from memory.ids import validate_user_id
from memory.inserts import InsertLog
from memory.lease import WRITE_LEASE_WAIT_S, hold_write, lease, store_key
from memory.lease_row import LEASE_TTL_S, RowLease

log = logging.getLogger(__name__)
#: what a write takes: an Arrow table, a Polars frame or row dicts (conformed to the table's schema)
Rows: TypeAlias = "pa.Table | pl.DataFrame | list[dict[str, Any]]"

# one writer per (store uri, table) within a process: concurrent merge_insert of the same new key
# can duplicate upstream, and several Store objects may open the same uri
_WRITE_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_WRITE_LOCKS_GUARD = threading.Lock()

#: row-level virtual columns a read may ask for (the row's physical address changes when the row is
#: rewritten: an update, a compaction)
VIRTUAL_COLUMNS = {"_rowaddr": pa.uint64(), "_rowid": pa.uint64()}
#: handles checked out at a past version, kept per store
PINNED_HANDLES = 32


def _write_lock(uri: str, name: str) -> threading.Lock:
    with _WRITE_LOCKS_GUARD:
        return _WRITE_LOCKS.setdefault((uri, name), threading.Lock())


def user_filter(user_id: str) -> Expr:
    """The typed `user_id = ...` filter for one validated user."""
    return col("user_id") == lit(validate_user_id(user_id))


def users_filter(user_ids: list[str]) -> Expr:
    """The typed `user_id IN (...)` filter for several validated users (one scan for all of them)."""
    return col("user_id").isin([validate_user_id(u) for u in user_ids])


class Store:
    """A LanceDB database holding every mnemo table; `dim` is the embedder's vector width."""

    def __init__(self, uri: str, dim: int = 384, *, consistency_s: float | None = 0.0,
                 write_lease_wait_s: float = WRITE_LEASE_WAIT_S, lease_backend: str = "auto",
                 lease_ttl_s: float = LEASE_TTL_S) -> None:
        self.uri = str(uri)
        self.dim = dim
        self.write_lease_wait_s = write_lease_wait_s
        self.lease_backend, self.lease_ttl_s = lease_backend, lease_ttl_s
        self.lease_key = store_key(self.uri)
        interval = None if consistency_s is None else timedelta(seconds=consistency_s)
        try:
            self.db = lancedb.connect(self.uri, read_consistency_interval=interval)
        except Exception as exc:  # lancedb raises plain errors for bad URIs
            raise StoreError(f"cannot open store {self.uri!r}: {exc}", uri=self.uri) from exc
        self._tables: dict[str, Any] = {}
        self._indexed: set[str] = set()
        # with a consistency interval LanceDB refreshes handles itself; without one we refresh them
        self._refresh = consistency_s is None
        self._lock = threading.Lock()
        self._pinned: OrderedDict[tuple[str, int], Any] = OrderedDict()   # (table, version) -> handle
        #: the versions of its tables that were plain inserts, and of whose rows (`memory.inserts`)
        self.inserts = InsertLog()
        #: the commit marker this handle last read, by `units` version (`units.latest_marker`'s memo)
        self.marker_memo: tuple[int, dict[str, Any] | None] | None = None

    # -- tables ---------------------------------------------------------------------------
    def table_names(self) -> list[str]:
        names = self.db.list_tables() if hasattr(self.db, "list_tables") else self.db.table_names()
        tables = getattr(names, "tables", names)
        return list(tables)

    def has_table(self, name: str) -> bool:
        if name in self._tables:  # opened or created through this store: no directory listing
            return True
        return name in self.table_names()

    def table(self, name: str) -> Any:
        """Open a table, creating it empty with its schema when missing."""
        evolve = False
        with self._lock:
            tbl = self._tables.get(name)
        if tbl is not None:
            return tbl
        schema = schemas.schema_for(name, self.dim)
        opened = self.db.open_table(name) if self.has_table(name) else None   # outside `_lock`: tables
        with self._lock:                                                     # open in parallel
            tbl = self._tables.get(name)
            if tbl is None:
                if opened is not None:
                    tbl = opened
                    self._check_dim(name, tbl.schema)
                    evolve = True
                else:
                    tbl = self.db.create_table(name, schema=schema, exist_ok=True)
                self._tables[name] = tbl
        if evolve:   # outside `_lock`: a writer holding the lease may be waiting for it
            self._add_missing_columns(name, tbl, schema)
        return tbl

    def _add_missing_columns(self, name: str, tbl: Any, schema: pa.Schema) -> None:
        """Evolve a table written by an older mnemo: columns added to its schema since then are
        added as nulls (all new columns are nullable), so old stores keep working."""
        have = set(tbl.schema.names)
        missing = [f for f in schema if f.name not in have]
        if not missing:
            return
        if any(not f.nullable for f in missing):
            raise StoreError(f"table {name!r} in {self.uri} lacks required columns "
                             f"{[f.name for f in missing if not f.nullable]}: rebuild the store", table=name)
        with self.write_lease():
            tbl.checkout_latest()   # another process may have evolved it meanwhile
            missing = [f for f in schema if f.name not in set(tbl.schema.names)]
            if missing:
                tbl.add_columns(missing)
        log.info("added columns %s to %s", [f.name for f in missing], name)

    def _check_dim(self, name: str, schema: pa.Schema) -> None:
        for field in schema:
            if pa.types.is_fixed_size_list(field.type) and field.type.list_size != self.dim:
                raise StoreError(
                    f"table {name!r} in {self.uri} stores {field.type.list_size}-d vectors but the "
                    f"embedder makes {self.dim}-d ones: use the store's original embedder or a new store",
                    table=name, stored_dim=field.type.list_size, dim=self.dim,
                )

    # -- writes ---------------------------------------------------------------------------
    def conform(self, name: str, data: Rows) -> pa.Table:
        """Cast rows to the table's schema (missing nullable columns become nulls); a searchable
        table's rows get their BM25 terms from their text (`memory.terms`), whatever came in."""
        schema = schemas.schema_for(name, self.dim)
        if isinstance(data, pl.DataFrame):
            data = data.to_arrow()
        if isinstance(data, list):
            return terms.with_terms(name, pa.Table.from_pylist(data, schema=schema))
        cols = [data.column(f.name).cast(f.type) if f.name in data.column_names else pa.nulls(data.num_rows, f.type)
                for f in schema]
        return terms.with_terms(name, pa.Table.from_arrays(cols, schema=schema))

    def upsert(self, name: str, data: Rows) -> int:
        """Insert or replace rows by `id`; returns the number of rows written."""
        return self._write(name, data, mode="upsert")

    def insert_absent(self, name: str, data: Rows) -> int:
        """Insert the rows (the first of a repeated id) whose `id` is not stored, leave stored ones as they are
        (a retried write keeps its first version: feedback's `created_at`); returns the number inserted."""
        return self._write(name, data, mode="absent")

    def _write(self, name: str, data: Rows, *, mode: str) -> int:
        """Conform, de-duplicate and write rows under the writer lease: a `merge_insert` on `id` that
        replaces stored rows ("upsert") or skips them ("absent"), or a plain add ("insert")."""
        table = self.conform(name, data)
        if table.num_rows == 0:
            return 0
        table, written = _dedupe(table, keep="first" if mode == "absent" else "last"), None
        with self.write_lease(), _write_lock(self.uri, name):
            tbl = self.table(name)
            tbl.checkout_latest()  # writes always start from the newest version (stale handles duplicate)
            if mode == "insert":
                before = int(tbl.version)
                tbl.add(table, on_bad_vectors="null")
                if "user_id" in table.column_names:
                    self.inserts.note(name, before, int(tbl.version), pc.unique(table.column("user_id")).to_pylist())
            else:
                merge = tbl.merge_insert("id")
                merge = merge.when_matched_update_all() if mode == "upsert" else merge
                done = merge.when_not_matched_insert_all().execute(table, on_bad_vectors="null")
                written = int(done.num_inserted_rows) if mode == "absent" else None
            self._ensure_user_index(name, tbl)
        return table.num_rows if written is None else written

    def drop_table(self, name: str) -> None:
        """Remove a whole table (and this store's handle to it)."""
        self.inserts.forget(name)
        with self._lock:
            self._tables.pop(name, None)
            self._indexed.discard(name)
            self._forget_pinned(name)
        with self.write_lease():
            self.db.drop_table(name)

    def insert(self, name: str, data: Rows) -> int:
        """Append rows whose ids the caller checked are not stored, while it holds the writer lease
        (`memory.ingest`'s new messages): no merge, so the cost does not grow with the table (an
        upsert joins every stored id). Returns the number of rows written."""
        return self._write(name, data, mode="insert")

    def delete(self, name: str, where: Expr) -> None:
        with self.write_lease():
            self.table(name).delete(where)

    @contextmanager
    def write_lease(self) -> Iterator[None]:
        """Hold the store's writer lease (`memory.lease`: one writer per store across processes, for
        one write) for a block; every write takes it, and it is re-entrant, so a caller may hold it
        across several writes to make them one unit for other writers (`unit()` also makes them one
        for readers). Raises StoreBusyError after `write_lease_wait_s`, or when a lease row was lost."""
        held = lease(self.uri, "write", self.lease_backend, self.lease_ttl_s)
        outermost = not held.held()
        with hold_write(held, self.uri, self.write_lease_wait_s):
            if isinstance(held, RowLease) and not held.valid():
                raise StoreBusyError(f"store {self.uri}: this writer's lease expired before it could renew "
                                     f"it (lease_ttl_s {self.lease_ttl_s:g}); retry", uri=self.uri)
            if outermost:
                units.recover(self)   # a unit whose holder died: let readers move past it
            yield

    def unit(self, user_ids: Iterable[str] = (), label: str = "unit") -> AbstractContextManager[None]:
        """Several writes that readers see all together or not at all (a shard commit, a forget): holds
        the write lease for the block and publishes a commit marker (`memory.units`)."""
        return units.unit(self, user_ids, label)

    def snapshot(self, tables: Iterable[str]) -> dict[str, int]:
        """The version of each table a reader should pin: never half of a unit (`memory.units`)."""
        return units.snapshot(self, tables)

    def _ensure_user_index(self, name: str, tbl: Any) -> None:
        if name not in schemas.USER_TABLES or name in self._indexed:
            return
        if any("user_id" in idx.columns for idx in tbl.list_indices()):
            self._indexed.add(name)
            return
        try:
            tbl.create_scalar_index("user_id", index_type="BTREE")
            self._indexed.add(name)
        except Exception as exc:  # an index is an optimisation; never fail a write for it
            log.warning("could not index %s.user_id: %s", name, exc)

    def optimize(self, tables: Iterable[str] | None = None, *, min_fragments: int = 0,
                 cleanup_older_than_s: float | None = None) -> list[str]:
        """Compact the data files of `tables` (default: all) holding more than `min_fragments` fragments,
        refresh their indices and delete the files of versions created over `cleanup_older_than_s` ago
        (never the latest; None: LanceDB's 7 days). Every write makes a version and most a fragment, so
        without this a store's file count grows with its runs. A table that fails is logged and
        skipped (`optimize_table` raises). Returns the tables compacted."""
        done = []
        names = set(self.table_names())
        for name in sorted(set(tables) & names if tables is not None else names):
            try:
                if self.optimize_table(name, min_fragments=min_fragments, cleanup_older_than_s=cleanup_older_than_s):
                    done.append(name)
            except Exception as exc:  # compaction is an optimisation; never fail a run for it
                log.warning("optimize %s failed: %s", name, exc)
        return done

    def optimize_table(self, name: str, *, min_fragments: int = 0, cleanup_older_than_s: float | None = None,
                       delete_unverified: bool = False) -> bool:
        """`optimize` of one table, under the writer lease, raising what fails (a purge must not pass a
        failure by: `memory.forget_purge`). `min_fragments` -1 takes an empty table too (its old
        versions may still hold files); `cleanup_older_than_s` 0 removes every version but the latest;
        `delete_unverified` also removes recent files that no version names (left by an unfinished
        commit; safe only because the lease keeps other writers out). Returns whether it compacted."""
        older = None if cleanup_older_than_s is None else timedelta(seconds=cleanup_older_than_s)
        with self.write_lease():
            tbl = self.table(name)
            tbl.checkout_latest()
            if min_fragments >= 0 and tbl.stats()["fragment_stats"]["num_fragments"] <= min_fragments:
                return False
            with warnings.catch_warnings():  # the warning about short cleanups (0 included): see the setting
                warnings.simplefilter("ignore", UserWarning)
                tbl.optimize(cleanup_older_than=older, delete_unverified=delete_unverified)
        return True

    def reindex_users(self, name: str) -> None:
        """Build the table's `user_id` index again from its live rows (a forget's purge: the index made
        before it still lists the forgotten user's id), when the table has one."""
        with self.write_lease():
            tbl = self.table(name)
            tbl.checkout_latest()
            if any("user_id" in idx.columns for idx in tbl.list_indices()):
                tbl.create_scalar_index("user_id", index_type="BTREE", replace=True)

    def data_files(self) -> dict[str, tuple[int, int]]:
        """(data fragments, bytes) of the latest version of every table: what compaction keeps bounded."""
        out = {}
        for name in sorted(self.table_names()):
            tbl = self.table(name)
            tbl.checkout_latest()
            st = tbl.stats()
            out[name] = (int(st["fragment_stats"]["num_fragments"]), int(st["total_bytes"]))
        return out

    # -- reads ----------------------------------------------------------------------------
    def read(self, name: str, user_id: str | None = None, *, columns: list[str] | None = None,
             where: Expr | None = None, version: int | None = None, null: str | None = None,
             limit: int | None = None) -> pa.Table:
        """Rows of one table, scoped to one user when `user_id` is given; as they were at table
        version `version` when given (0: the table did not exist then), else at the latest; a column
        added since that version (an older mnemo wrote it) is read as nulls. `columns` may name the
        virtual `_rowaddr` / `_rowid`; `null` keeps the rows where that column is null, `limit` the
        first rows."""
        if version == 0 or not self.has_table(name):
            return self._empty(name, columns)
        if version is None:
            tbl = self.table(name)
            if self._refresh:
                tbl.checkout_latest()
        else:   # the latest has every column (added on open); an older version may not
            tbl = self.at_version(name, version)
            have = set(tbl.schema.names) | set(VIRTUAL_COLUMNS) if columns else set()
            if absent := [c for c in columns or () if c not in have]:
                t = self.read(name, user_id, columns=[c for c in columns or () if c in have], where=where,
                              version=version, null=null, limit=limit)
                nulls = {c: pa.nulls(t.num_rows, schemas.schema_for(name, self.dim).field(c).type) for c in absent}
                return pa.table({c: nulls[c] if c in nulls else t.column(c) for c in columns or ()})
        cond = user_filter(user_id) if user_id is not None else None
        if where is not None:
            cond = where if cond is None else (cond & where)
        q = tbl.search()
        if null is not None:   # `lancedb.expr` has no null test; the name is checked against the schema
            is_null = f"{schemas.schema_for(name, self.dim).field(null).name} IS NULL"
            q = q.where(is_null if cond is None else f"({cond.to_sql()}) AND {is_null}")
        elif cond is not None:
            q = q.where(cond)
        if columns is not None:
            q = q.select(columns)
        if version is None:
            return q.limit(limit).to_arrow()
        try:
            return q.limit(limit).to_arrow()
        except Exception as exc:   # its files were cleaned up under a cached handle (a purge, a compaction)
            with self._lock:
                self._pinned.pop((name, int(version)), None)
            raise VersionGoneError(f"cannot read table {name!r} at version {version}: {exc}", table=name,
                                   version=version) from exc

    def _empty(self, name: str, columns: list[str] | None) -> pa.Table:
        schema = schemas.schema_for(name, self.dim)
        if columns is None:
            return schema.empty_table()
        fields = [pa.field(c, VIRTUAL_COLUMNS[c]) if c in VIRTUAL_COLUMNS else schema.field(c) for c in columns]
        return pa.schema(fields).empty_table()

    def at_version(self, name: str, version: int) -> Any:
        """A read-only handle of table `name` checked out at `version` (cached: the next reads of the
        same version reuse it)."""
        key = (name, int(version))
        with self._lock:
            tbl = self._pinned.get(key)
            if tbl is not None:
                self._pinned.move_to_end(key)
                return tbl
        try:
            tbl = self.db.open_table(name)
            tbl.checkout(key[1])
        except Exception as exc:   # lancedb raises plain errors for a missing or cleaned-up version
            raise VersionGoneError(f"cannot read table {name!r} at version {version}: {exc}", table=name,
                                   version=version) from exc
        with self._lock:
            self._pinned[key] = tbl
            while len(self._pinned) > PINNED_HANDLES:
                self._pinned.popitem(last=False)
        return tbl

    def _forget_pinned(self, name: str, newer_than: int = -1) -> None:
        """Drop the pinned handles of `name` above a version (caller holds `_lock`)."""
        for key in [k for k in self._pinned if k[0] == name and k[1] > newer_than]:
            del self._pinned[key]

    def read_ids(self, name: str, ids: Iterable[str], *, columns: list[str] | None = None) -> pa.Table:
        ids = list(ids)
        if not ids or not self.has_table(name):
            return schemas.schema_for(name, self.dim).empty_table()
        return self.read(name, columns=columns, where=col("id").isin(ids))

    def users(self) -> list[str]:
        """Every user with ingested messages, sorted."""
        t = self.read("messages", columns=["user_id"])
        return sorted(set(t.column("user_id").to_pylist()))

    def count_by_user(self, name: str) -> dict[str, int]:
        if not self.has_table(name):
            return {}
        t = self.read(name, columns=["user_id"])
        vc = pc.value_counts(t.column("user_id")).to_pylist()
        return {d["values"]: d["counts"] for d in vc}

    def version(self, name: str) -> int:
        if not self.has_table(name):
            return 0
        tbl = self.table(name)
        tbl.checkout_latest()
        latest = int(tbl.version)
        with self._lock:   # versions went back: the table was dropped and made again; old pins are void
            self._forget_pinned(name, newer_than=latest)
        return latest


def _dedupe(table: pa.Table, keep: str) -> pa.Table:
    """One row per id, the `keep` ("first" or "last") of each (merge_insert with duplicate keys is an error)."""
    if len(set(ids := table.column("id").to_pylist())) == len(ids):
        return table
    at = {key: i for i, key in (enumerate(ids) if keep == "last" else reversed(list(enumerate(ids))))}
    return table.take(sorted(at.values()))
