"""The read side of consolidated memory that is not a search: a user's graph, profile and phases,
and counts per user. Retrieval, the CLI and the graph page read through here, never through a stage."""
from __future__ import annotations

from typing import Any

import polars as pl

from memory.store import Store

#: the key of the MemWeaver global profile row in `summaries`
PROFILE_KEY = "user profile"

#: what `mnemo stats` counts: name -> table
STATS_TABLES = {"messages": "messages", "sessions": "sessions", "fragments": "fragments",
                "insights": "insights", "clusters": "clusters", "links": "links", "summaries": "summaries",
                "topics": "topics", "graph_nodes": "graph_nodes", "graph_edges": "graph_edges"}


def _frame(table: Any) -> pl.DataFrame:
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    return df


def load_graph(store: Store, user: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(nodes ordered by seq, temporal edges) of one user's stored graph."""
    nodes = _frame(store.read("graph_nodes", user))
    edges = _frame(store.read("graph_edges", user))
    return (nodes.sort("seq") if nodes.height else nodes), edges


def read_profile(store: Store, user: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(the profile row or None, the phase rows oldest first) of one user."""
    t = _frame(store.read("summaries", user, columns=[
        "id", "level", "key", "content", "date", "start_ts", "end_ts", "n_items", "source_ids", "member_ids"]))
    if t.height == 0:
        return None, []
    prof = t.filter(pl.col("level") == "profile")
    phases = t.filter(pl.col("level") == "phase").sort(["start_ts", "end_ts", "id"]).to_dicts()
    return (prof.row(0, named=True) if prof.height else None), phases


def stats(store: Store) -> dict[str, dict[str, dict[str, int]]]:
    """Counts per user per memory kind (nothing time-dependent), as `mnemo stats --json` prints."""
    counts = {name: store.count_by_user(table) for name, table in STATS_TABLES.items()}
    users = sorted(set().union(*[set(c) for c in counts.values()]))
    return {"users": {u: {name: counts[name].get(u, 0) for name in STATS_TABLES} for u in users}}
