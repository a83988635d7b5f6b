"""Late sessions: a session that arrives after the user's watermark but is dated before it is
consolidated by the next ordinary run (no --rebuild-graph), and the graph, the phases and the cluster
pool place it in time order, as a consolidation of everything at once would."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from memory.runs import consolidate, open_store
from memory.settings import Settings
from memory.stages.reason import pair_context
from memory.stages.shard import Cluster, Link, ShardState, all_fragments
from memory.store import Store
from tests.helpers import SAMPLE, add_part, copy_store, ingest_and_consolidate

LATE = "alice-s2"     # 2024-03-16, between alice-s1 (03-02) and alice-s3 (03-30)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory, consolidated_sample: Any) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("late")
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    on_time, late = tmp / "on_time.jsonl", tmp / "late.jsonl"
    on_time.write_text("".join(json.dumps(r) + "\n" for r in rows if r["session_id"] != LATE))
    late.write_text("".join(json.dumps(r) + "\n" for r in rows if r["session_id"] == LATE))
    store = ingest_and_consolidate(tmp / "late-store", on_time)
    before = {t: store.read(t, "alice").num_rows for t in ("fragments", "graph_nodes", "summaries")}
    report = add_part(store, late)
    shutil.copytree(tmp / "late-store", tmp / "rebuilt")
    reb = Settings(store=str(tmp / "rebuilt"), rebuild_graph=True)
    rebuilt = open_store(reb)
    consolidate(rebuilt, reb)
    fresh = open_store(Settings(store=str(consolidated_sample[0])))
    return {"store": store, "report": report, "before": before, "rebuilt": rebuilt, "fresh": fresh}


def _order(store: Store, user: str) -> list[tuple[int, Any, str]]:
    return sorted((r["seq"], r["session_ts"], r["node_id"])
                  for r in store.read("graph_nodes", user, columns=["seq", "session_ts", "node_id"]).to_pylist())


def test_late_session_is_consolidated_by_the_next_run(stores: dict[str, Any]) -> None:
    store = stores["store"]
    assert stores["report"].counts["sessions"] == 1
    frags = store.read("fragments", "alice", columns=["id", "session_id"]).to_pylist()
    assert any(f["session_id"] == LATE for f in frags)
    fresh = {f["id"] for f in stores["fresh"].read("fragments", "alice", columns=["id"]).to_pylist()}
    assert {f["id"] for f in frags} == fresh                 # the same fragments as on time
    assert store.read("fragments", "alice").num_rows > stores["before"]["fragments"]


def test_reason_requests_quote_both_sides_of_every_link(stores: dict[str, Any]) -> None:
    """A late session's link to a later session's cluster (stored, not in the shard) is reasoned over
    with both clusters' fragments: `all_fragments` loads the stored side of either end."""
    store = stores["store"]
    clusters = {c["id"]: Cluster.from_row(c) for c in store.read("clusters", "alice").to_pylist()}
    links = [Link(pool=clusters[r["pool_cluster_id"]], new=clusters[r["new_cluster_id"]], similarity=r["similarity"])
             for r in store.read("links", "alice").to_pylist()]
    assert any(lk.pool.session_id == LATE for lk in links)          # links from the late session onward
    state = ShardState(run_id="t", users=["alice"], links=links)
    fragments = all_fragments(state, store)
    for lk in links:
        pair = pair_context(lk, fragments)
        assert pair["earlier"] and pair["later"], lk.id


def test_graph_in_time_order(stores: dict[str, Any]) -> None:
    store = stores["store"]
    nodes = _order(store, "alice")
    memories = {r["id"] for t in ("fragments", "insights") for r in store.read(t, "alice", columns=["id"]).to_pylist()}
    assert {n for _, _, n in nodes} == memories and [s for s, _, _ in nodes] == list(range(len(nodes)))
    times = [ts for _, ts, _ in nodes]
    assert times == sorted(times)                             # seq follows time, the late session inside
    by_seq = {s: n for s, _, n in nodes}
    edges = {(e["src_id"], e["dst_id"]) for e in store.read("graph_edges", "alice").to_pylist()}
    assert edges == {(by_seq[i], by_seq[i + 1]) for i in range(len(nodes) - 1)}
    assert nodes == _order(stores["rebuilt"], "alice")       # what --rebuild-graph makes of the same memories


def test_phases_in_time_order(stores: dict[str, Any]) -> None:
    store = stores["store"]
    phases = sorted((r for r in store.read("summaries", "alice").to_pylist() if r["level"] == "phase"),
                    key=lambda r: r["start_ts"])
    frags = {r["id"]: r["session_ts"] for r in store.read("fragments", "alice", columns=["id", "session_ts"]).to_pylist()}
    members = [m for p in phases for m in p["member_ids"]]
    assert sorted(members) == sorted(frags)                  # every fragment in exactly one phase
    assert [frags[m] for m in members] == sorted(frags[m] for m in members)
    for a, b in zip(phases, phases[1:]):
        assert a["end_ts"] <= b["start_ts"]
    late_ts = min(ts for fid, ts in frags.items() if fid in members and ts > min(frags.values()))
    assert any(p["start_ts"] <= late_ts <= p["end_ts"] for p in phases)
    profiles = [r for r in store.read("summaries", "alice").to_pylist() if r["level"] == "profile"]
    assert len(profiles) == 1 and set(profiles[0]["member_ids"]) == {p["id"] for p in phases}


def test_links_and_pool_in_time_order(stores: dict[str, Any]) -> None:
    store = stores["store"]
    clusters = {c["id"]: c for c in store.read("clusters", "alice").to_pylist()}
    assert any(c["session_id"] == LATE for c in clusters.values())
    for lk in store.read("links", "alice").to_pylist():
        pool, new = clusters[lk["pool_cluster_id"]], clusters[lk["new_cluster_id"]]
        assert pool["session_ts"] <= new["session_ts"]       # the pool side is always the earlier one
        assert pool["consumed_ts"] is None or pool["consumed_ts"] >= pool["session_ts"]
    for c in clusters.values():
        assert c["consumed_ts"] is None or c["consumed_ts"] >= c["session_ts"]
    insights = store.read("insights", "alice", columns=["session_ts", "link_id"]).to_pylist()
    links = {lk["id"]: lk for lk in store.read("links", "alice").to_pylist()}
    for i in insights:
        lk = links.get(i["link_id"])
        if lk:
            assert i["session_ts"] == max(clusters[lk["pool_cluster_id"]]["session_ts"],
                                          clusters[lk["new_cluster_id"]]["session_ts"])


def bob_five_miles(tmp_path: Path) -> Path:
    """A session of Bob's dated before all of his (1 March 2024): "5 miles, my longest run so far"."""
    path = tmp_path / "bob-s0.jsonl"
    turns = [("Bob", "I ran 5 miles yesterday, my longest run so far, and my left knee felt fine."),
             ("assistant", "Nice! Keep building slowly.")]
    path.write_text("".join(json.dumps({"user_id": "bob", "session_id": "bob-s0", "message_id": f"bob-s0-m0{i}",
                                        "speaker": spk, "text": text, "timestamp": f"2024-03-01T19:0{i}:00Z"}) + "\n"
                            for i, (spk, text) in enumerate(turns, start=1)))
    return path


def test_a_late_fact_is_closed_by_a_newer_stored_one_even_when_that_one_was_replaced(
        consolidated_sample: Any, tmp_path: Path) -> None:
    """Bob's stored "8 miles" was replaced by "10 miles"; a late session says "5 miles, my longest run
    so far": the newer stored fragments close it, as a single run of everything does (a closed
    candidate was skipped whatever its side, and the late fact stayed current)."""
    store = copy_store(consolidated_sample[0], tmp_path / "store")
    add_part(store, bob_five_miles(tmp_path))
    rows = store.read("fragments", "bob", columns=["source_ids", "content", "superseded_by"]).to_pylist()
    five = [r for r in rows if "bob-s0-m01" in (r["source_ids"] or []) and "5 miles" in r["content"]]
    assert five and all(r["superseded_by"] for r in five)


def test_a_chain_of_three_values_in_one_run_leaves_only_the_last_current(tmp_path: Path) -> None:
    """5 -> 8 -> 10 miles in one run: the turn saying 10 is nearer the 5 (already replaced by the 8)
    than the 8 by vector; it was linked to the 5 alone and the 8 stayed current. The nearest turn
    whose values were all replaced no longer uses up the update's one older turn."""
    both = tmp_path / "all.jsonl"
    both.write_text(SAMPLE.read_text() + bob_five_miles(tmp_path).read_text())
    store = ingest_and_consolidate(tmp_path / "store", both)
    rows = store.read("fragments", "bob", columns=["source_ids", "content", "superseded_by"]).to_pylist()
    miles = {r["content"][:14]: r["superseded_by"] for r in rows if "miles yesterday" in r["content"]}
    assert miles and miles.get("Bob ran 8 mile") and miles.get("Bob ran 5 mile"), miles


def hiking_session(tmp_path: Path, sid: str, day: str, texts: list[str]) -> Path:
    """One session of Carol's about hiking, dated `day`."""
    path = tmp_path / f"{sid}.jsonl"
    path.write_text("".join(json.dumps({"user_id": "carol", "session_id": sid, "message_id": f"{sid}-m{i}",
                                        "speaker": "Carol", "text": text, "timestamp": f"{day}T10:0{i}:00Z"}) + "\n"
                            for i, text in enumerate(texts)))
    return path


def test_a_late_session_links_to_clusters_consumed_after_its_time(tmp_path: Path) -> None:
    """s1 (January) and s3 (March) are about hiking: s3's cluster consumed s1's. A late s2 (February)
    on hiking arrives: s1's cluster was in the pool at s2's time, so s2 links to it as it would have
    on time (an insight over the pair), and s1's cluster stays consumed by s3."""
    s1 = hiking_session(tmp_path, "c-s1", "2024-01-10", ["I love hiking in the mountains on weekends.",
                                                         "I hiked the Blue Ridge trail with my hiking boots."])
    s3 = hiking_session(tmp_path, "c-s3", "2024-03-10", ["I went hiking in the mountains again this weekend.",
                                                         "My hiking boots held up well on the mountain trail."])
    s2 = hiking_session(tmp_path, "c-s2", "2024-02-10", ["I love hiking on mountain trails in winter too.",
                                                         "I bought new hiking boots for the mountain trails."])
    store = ingest_and_consolidate(tmp_path / "store", s1, s3)
    before = {c["id"]: c for c in store.read("clusters", "carol").to_pylist()}
    s1_clusters = {i for i, c in before.items() if c["session_id"] == "c-s1"}
    assert s1_clusters and all(before[i]["consumed_ts"] is not None for i in s1_clusters)   # by s3
    add_part(store, s2)
    clusters = {c["id"]: c for c in store.read("clusters", "carol").to_pylist()}
    links = store.read("links", "carol").to_pylist()
    s2_clusters = {i for i, c in clusters.items() if c["session_id"] == "c-s2"}
    assert {(lk["pool_cluster_id"], lk["new_cluster_id"]) for lk in links} & {
        (p, c) for p in s1_clusters for c in s2_clusters}                       # s1 -> s2 linked
    for i in s1_clusters:                                                      # consumption kept
        assert (clusters[i]["consumed_ts"], clusters[i]["consumed_by"]) == (
            before[i]["consumed_ts"], before[i]["consumed_by"])
    linked = {lk["id"] for lk in links if lk["pool_cluster_id"] in s1_clusters and lk["new_cluster_id"] in s2_clusters}
    assert {i["link_id"] for i in store.read("insights", "carol").to_pylist()} & linked
