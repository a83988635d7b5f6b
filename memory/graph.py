"""Memories as the nodes of a user's graph: the time order the MemWeaver graph (the weave stage) and
its phases (the summarize stage) share, and reading a user's stored memories as nodes.

Nodes are a user's fragments and insights in time order: session time, then session id (two
sessions starting at the same time stay apart), then fragments before insights, then the position of
the first cited message (`Node.order`). Every Δt of the graph and of
the walk is in days (`days`).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable

import numpy as np
import polars as pl
from lancedb.expr import col

from memory.schemas import MEMORY_TABLES
from memory.store import Store

KIND_RANK = {"fragment": 0, "insight": 1}


@dataclass
class Node:
    """One memory as a node: what weave and summarize need of a fragment or insight."""

    id: str
    kind: str
    session_ts: datetime
    position: int            # seq of the first cited message (0 for insights)
    vector: np.ndarray
    source_ids: list[str]
    text: str = ""
    date: str = ""
    session_id: str = ""

    def order(self) -> tuple[Any, ...]:
        return (self.session_ts, self.session_id, KIND_RANK.get(self.kind, 2), self.position, self.id)


def days(a: datetime, b: datetime) -> float:
    """|b - a| in days (the unit of every Δt of the graph and the walk)."""
    return abs((b - a).total_seconds()) / 86400.0


def node_of(r: dict[str, Any], kind: str, seqs: dict[str, Any]) -> Node:
    """A fragment or insight row as a node; `seqs`: message id -> seq of the user's messages."""
    sources = list(r.get("source_ids") or [])
    pos = min((int(seqs[s]) for s in sources if seqs.get(s) is not None), default=0) if kind == "fragment" else 0
    return Node(id=r["id"], kind=kind, session_ts=r["session_ts"], position=pos,
                vector=np.asarray(r["vector"], dtype=np.float32), source_ids=sources, text=r.get("text") or "",
                date=r.get("date") or "", session_id=r.get("session_id") or "")


def stored_nodes(store: Store, user: str, until: datetime,
                 kinds: tuple[str, ...] = ("fragment", "insight"), ids: Iterable[str] | None = None) -> list[Node]:
    """The user's stored memories of sessions up to `until` (the watermark) as nodes (those of `ids`
    only, when given: then only the messages they cite are read for their positions)."""
    only = None if ids is None else col("id").isin(sorted(ids))
    rows: list[tuple[str, dict[str, Any]]] = []
    for kind in kinds:
        cols = ["id", "session_id", "session_ts", "source_ids", "vector", "text", "date"]
        t = pl.from_arrow(store.read(MEMORY_TABLES[kind], user, columns=cols, where=only))
        assert isinstance(t, pl.DataFrame)
        if t.height:
            rows += [(kind, r) for r in t.filter(pl.col("session_ts") <= until).iter_rows(named=True)
                     if r["vector"] is not None]
    cited = sorted({m for _, r in rows for m in r["source_ids"] or []})
    msgs = None if not cited else store.read("messages", user, columns=["message_id", "seq"],
                                             where=None if ids is None else col("message_id").isin(cited))
    seqs = {} if msgs is None else dict(zip(msgs.column("message_id").to_pylist(), msgs.column("seq").to_pylist()))
    return [node_of(r, kind, seqs) for kind, r in rows]


def with_stored(batch: list[Node], store: Store, user: str, until: datetime,
                kinds: tuple[str, ...] = ("fragment", "insight")) -> list[Node]:
    """The shard's new nodes plus the user's stored ones up to `until`: a rebuild's input (unordered)."""
    known = {n.id for n in batch}
    return batch + [n for n in stored_nodes(store, user, until, kinds) if n.id not in known]


def stored_ids(store: Store, user: str, until: datetime, kinds: tuple[str, ...]) -> set[str]:
    """Ids of the user's stored memories of these kinds, of sessions up to `until`."""
    out: set[str] = set()
    for kind in kinds:
        t = pl.from_arrow(store.read(MEMORY_TABLES[kind], user, columns=["id", "session_ts"]))
        assert isinstance(t, pl.DataFrame)
        if t.height:
            out |= set(t.filter(pl.col("session_ts") <= until)["id"].to_list())
    return out
