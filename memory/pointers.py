"""Validity pointers (issue 12): the columns of a fragment or insight that name another memory
(`superseded_by`, `contradicts`), clearing those that name a memory gone, and finding those that
name a row stored nowhere. One place for what a forget, its re-derivation view and `doctor` do alike.
"""
from __future__ import annotations

from typing import Iterable

import pyarrow as pa
import pyarrow.compute as pc
from lancedb.expr import col

from memory.store import Store, users_filter

__all__ = ["POINTERS", "clear_pointers", "unstored"]

#: each pointer column and the columns reset with it when what it names is gone
POINTERS = (("superseded_by", ("valid_until", "superseded_by")), ("contradicts", ("contradicts",)))
#: the tables whose rows a pointer may name: a turn (a newer turn's message row), a fragment, an insight
TARGETS = ("messages", "fragments", "insights")


def clear_pointers(t: pa.Table, dead: set[str]) -> pa.Table:
    """`t` with the validity pointers to `dead` memories (and their `valid_until`) set to null."""
    for pointer, cleared in POINTERS:
        if pointer not in t.column_names:
            continue
        hit = pc.fill_null(pc.is_in(t.column(pointer), value_set=pa.array(sorted(dead))), False)
        if not pc.any(hit).as_py():
            continue
        for c in cleared:
            if c in t.column_names:
                i = t.column_names.index(c)
                t = t.set_column(i, c, pc.if_else(hit, pa.nulls(t.num_rows, t.schema.field(c).type), t.column(c)))
    return t


def unstored(store: Store, users: Iterable[str], ids: set[str]) -> set[str]:
    """The `ids` that name no stored turn, fragment or insight of `users` (one read per table, of
    the ids still unfound)."""
    missing = set(ids)
    users = sorted(users)
    for name in TARGETS:
        if missing and users and store.has_table(name):
            t = store.read(name, columns=["id"], where=users_filter(users) & col("id").isin(sorted(missing)))
            missing -= set(t.column("id").to_pylist())
    return missing
