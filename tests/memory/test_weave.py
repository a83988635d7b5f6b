"""MemWeaver graph (memory/stages/weave.py): K rule, one node per memory, a temporal chain, incremental
batches linked and clustered on their own, rebuild equal to one batch, crash recovery, upgrade."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from memory.runs import consolidate, open_store
from memory.settings import Settings
from memory.store import Store
from memory.stages.weave import K_DEFAULT, choose_k
from tests.helpers import SampleSplit, copy_store, crash_before_watermarks, killed_before


def graph(store: Store) -> dict[str, Any]:
    nodes = store.read("graph_nodes").to_pylist()
    edges = store.read("graph_edges").to_pylist()
    assert len({n["id"] for n in nodes}) == len(nodes) and len({e["id"] for e in edges}) == len(edges)
    return {"nodes": {(n["user_id"], n["node_id"]): (n["seq"], n["cluster_id"]) for n in nodes},
            "edges": {(e["user_id"], e["src_id"], e["dst_id"]): round(e["gap_days"], 4) for e in edges}}


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory, module_sample_store: Store,
           split_sample_stores: SampleSplit) -> dict[str, Any]:
    """one: the sample in one batch; two: in two (split_sample); first: two's graph after batch 1;
    rebuilt: two with its graph rebuilt. Copies of the session's stores: tests must not write them."""
    tmp = tmp_path_factory.mktemp("weave")
    one = module_sample_store
    first = graph(copy_store(split_sample_stores.first, tmp / "first"))
    two = copy_store(split_sample_stores.two, tmp / "two")
    shutil.copytree(tmp / "two", tmp / "rebuilt")
    reb_s = Settings(store=str(tmp / "rebuilt"), rebuild_graph=True)
    rebuilt = open_store(reb_s)
    consolidate(rebuilt, reb_s)
    return {"one": one, "two": two, "rebuilt": rebuilt, "first": first}


def test_k_rule() -> None:
    assert choose_k(0) == 0 and choose_k(1) == 1 and choose_k(2) == 1
    assert choose_k(10) == 3            # few nodes: at most one cluster per 3 nodes
    assert choose_k(300) == K_DEFAULT   # the paper's K = 5
    assert choose_k(1000) == 10         # very many: at most 100 nodes per cluster


def test_one_node_per_memory_and_a_chain(stores: dict[str, Any]) -> None:
    store = stores["one"]
    g = graph(store)
    for user in store.users():
        mem = {r["id"] for t in ("fragments", "insights") for r in store.read(t, user, columns=["id"]).to_pylist()}
        mine = {nid: v for (u, nid), v in g["nodes"].items() if u == user}
        assert set(mine) == mem
        assert sorted(s for s, _ in mine.values()) == list(range(len(mem)))
        assert len({c for _, c in mine.values()}) <= choose_k(len(mem))
        edges = [(s, d) for (u, s, d) in g["edges"] if u == user]
        assert len(edges) == len(mem) - 1  # a chain: consecutive nodes only
        by_seq = {v[0]: nid for nid, v in mine.items()}
        assert set(edges) == {(by_seq[i], by_seq[i + 1]) for i in range(len(mem) - 1)}
    nodes = store.read("graph_nodes").to_pylist()
    assert all(-1.0 <= n["centroid_sim"] <= 1.0001 and n["cluster_size"] >= 1 for n in nodes)


def test_incremental_batch_is_linked_and_clustered_alone(stores: dict[str, Any]) -> None:
    one, two, first = graph(stores["one"]), graph(stores["two"]), stores["first"]
    assert set(one["nodes"]) == set(two["nodes"])       # same nodes
    assert one["edges"] == two["edges"]                 # same chain: batch 2 starts after batch 1's last node
    for key, (seq, cluster) in first["nodes"].items():  # the old graph is not reprocessed
        assert two["nodes"][key] == (seq, cluster)
    new = {k: v for k, v in two["nodes"].items() if k not in first["nodes"]}
    assert new and not ({c for _, c in new.values()} & {c for _, c in first["nodes"].values()})


def test_rebuild_equals_one_batch(stores: dict[str, Any]) -> None:
    assert graph(stores["rebuilt"]) == graph(stores["one"])
    assert stores["rebuilt"].read("graph_nodes").num_rows == stores["one"].read("graph_nodes").num_rows


def test_rerun_changes_nothing(sample_store: Store) -> None:
    before = graph(sample_store)
    consolidate(sample_store, Settings(store=sample_store.uri))
    assert graph(sample_store) == before


def test_crash_before_watermarks_then_rerun(stores: dict[str, Any], split_sample_stores: SampleSplit,
                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = copy_store(split_sample_stores.first, tmp_path / "s")  # batch 1 consolidated
    crash_before_watermarks(monkeypatch, store, split_sample_stores.b)
    assert graph(store) == graph(stores["two"])


def test_rebuild_restores_a_missing_graph(stores: dict[str, Any], tmp_path: Path) -> None:
    """A store with memories but no graph (older than this stage) gets it back with --rebuild-graph."""
    shutil.copytree(stores["one"].uri, tmp_path / "old")
    settings = Settings(store=str(tmp_path / "old"))
    store = open_store(settings)
    for user in store.users():
        from memory.store import user_filter

        store.delete("graph_nodes", user_filter(user))
        store.delete("graph_edges", user_filter(user))
    assert store.read("graph_nodes").num_rows == 0
    consolidate(store, settings.with_overrides(rebuild_graph=False))  # no new sessions: nothing to do
    assert store.read("graph_nodes").num_rows == 0
    consolidate(store, settings.with_overrides(rebuild_graph=True))
    assert graph(store) == graph(stores["one"])


def test_a_rebuild_killed_before_its_deletions_keeps_the_old_graph_and_phases(
        sample_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """--rebuild-graph replaces each user's graph and summaries: the new rows are written first and
    only then the old ones not among them deleted, so a run killed in between keeps a graph, phases
    and a profile (the deletions came first: it had left no phases nor profile, and no later plain
    run saw work to do)."""
    def rows(name: str) -> set[str]:
        return set(sample_store.read(name, "alice", columns=["id"]).column("id").to_pylist())

    before = {name: rows(name) for name in ("graph_nodes", "graph_edges", "summaries")}
    assert all(before.values())
    settings = Settings(store=sample_store.uri, rebuild_graph=True)

    with killed_before(monkeypatch, "summaries"):             # the graph's new rows written, then killed
        consolidate(open_store(settings), settings)
    after = {name: rows(name) for name in before}
    assert after == before                  # deterministic ids: the same rows, rewritten, none lost
    consolidate(open_store(settings), settings)              # the rebuild run again completes
    assert {name: rows(name) for name in before} == before
