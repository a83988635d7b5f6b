"""`Store.insert_absent` on a real LanceDB store: rows whose id is stored are left as they are, new
ones are inserted, a repeated call writes nothing, and the first write creates the table."""
from __future__ import annotations

import threading
from pathlib import Path

from memory.store import Store


def _stages(store: Store) -> dict[str, str]:
    return {r["id"]: r["stage"] for r in store.read("quarantine", columns=["id", "stage"]).to_pylist()}


def test_stored_rows_keep_their_first_version(tmp_path: Path) -> None:
    st = Store(str(tmp_path / "store"))
    assert st.insert_absent("quarantine", [{"id": "a", "user_id": "ann", "stage": "first"}]) == 1
    rows = [{"id": "a", "user_id": "ann", "stage": "retry"}, {"id": "b", "user_id": "ann", "stage": "new"}]
    assert st.insert_absent("quarantine", rows) == 1
    assert _stages(st) == {"a": "first", "b": "new"}
    assert st.insert_absent("quarantine", rows) == 0 and _stages(st) == {"a": "first", "b": "new"}
    st.upsert("quarantine", rows)                          # an upsert replaces, for contrast
    assert _stages(st) == {"a": "retry", "b": "new"}


def test_concurrent_writers_of_one_new_id_store_it_once(tmp_path: Path) -> None:
    st = Store(str(tmp_path / "store"))
    st.insert_absent("quarantine", [{"id": "seed", "user_id": "ann", "stage": "x"}])
    won: list[int] = []

    def write(i: int) -> None:
        won.append(st.insert_absent("quarantine", [{"id": "same", "user_id": "ann", "stage": f"w{i}"}]))
    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = st.read("quarantine", columns=["id"]).column("id").to_pylist()
    assert sorted(ids) == ["same", "seed"] and sorted(won) == [0, 0, 0, 1]


def test_a_repeated_id_in_one_call_keeps_its_first_row(tmp_path: Path) -> None:
    st = Store(str(tmp_path / "store"))
    rows = [{"id": "c", "user_id": "ann", "stage": "first"}, {"id": "c", "user_id": "ann", "stage": "second"}]
    assert st.insert_absent("quarantine", rows) == 1 and _stages(st) == {"c": "first"}
    st.upsert("quarantine", rows)                          # an upsert keeps the last, as before
    assert _stages(st) == {"c": "second"}
