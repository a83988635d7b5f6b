"""`Store.read`'s null test and limit on a real LanceDB store: the rows without a value of one
column, alone, within one user's rows and with a typed filter, at a pinned version, and a column the
table does not have refused before any SQL is made from it."""
from __future__ import annotations

from pathlib import Path

import pytest
from lancedb.expr import col, lit

from memory.store import Store


def _rows() -> list[dict[str, str | None]]:
    return [
        {"id": "a", "user_id": None, "stage": "ingest", "raw": "x"},
        {"id": "b", "user_id": None, "stage": "extract", "raw": "y"},
        {"id": "c", "user_id": "ann", "stage": "it's", "raw": None},
        {"id": "d", "user_id": "ann", "stage": "ingest", "raw": None},
        {"id": "e", "user_id": "bob", "stage": "ingest", "raw": None},
    ]


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    st = Store(str(tmp_path / "store"))
    st.upsert("quarantine", _rows())
    return st


def _ids(store: Store, **kw: object) -> list[str]:
    return sorted(store.read("quarantine", **kw).column("id").to_pylist())  # type: ignore[arg-type]


def test_null_keeps_the_rows_without_a_value(store: Store) -> None:
    assert _ids(store, null="user_id") == ["a", "b"]
    assert _ids(store, null="raw") == ["c", "d", "e"]
    assert _ids(store, null="user_id", where=col("stage") == lit("ingest")) == ["a"]
    assert _ids(store, user_id="ann", null="raw") == ["c", "d"]
    # a value with a quote, rendered by LanceDB's own SQL writer beside the null test
    assert _ids(store, user_id="ann", where=col("stage") == lit("it's"), null="raw") == ["c"]


def test_null_and_limit_at_a_pinned_version(store: Store) -> None:
    before = store.version("quarantine")
    store.upsert("quarantine", [{"id": "f", "user_id": None, "stage": "ingest", "raw": "w"}])
    assert _ids(store, null="user_id") == ["a", "b", "f"]
    assert _ids(store, null="user_id", version=before) == ["a", "b"]
    assert store.read("quarantine", null="user_id", limit=2).num_rows == 2
    assert store.read("quarantine", limit=1, version=before).num_rows == 1


def test_a_column_the_table_lacks_is_refused(store: Store) -> None:
    with pytest.raises(KeyError):
        store.read("quarantine", null="user_id IS NULL OR 1=1 --")
