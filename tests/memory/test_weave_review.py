"""The MemWeaver graph and phases after a crash, a reopened session and sessions of the same time:
incremental runs agree with a clean run or a rebuild, and a re-segmentation asks only changed phases."""
from __future__ import annotations

import json
import random
import shutil
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from memory import prompts
from memory.ingest import ingest
from memory.llm.base import LLMRequest
from memory.runs import consolidate, open_store
from memory.settings import Settings
from memory.store import Store
from tests.helpers import SAMPLE, add_part, ingest_and_consolidate, killed_before

TOPICS = {
    "running": ["I ran {n} miles along the river this morning.", "I bought new trail running shoes from Brooks.",
                "My knee hurt after the {n} mile long run.", "I signed up for a {n}k race in the fall."],
    "cooking": ["I baked sourdough bread with a {n} hour proof.", "I cooked a vegetarian lasagna for {n} friends.",
                "I tried a new Thai curry recipe with tofu.", "I bought a cast iron skillet for {n} dollars."],
    "guitar": ["I practiced guitar scales for {n} minutes.", "I learned the F barre chord on my Yamaha guitar.",
               "I played Wonderwall at an open mic with {n} people.", "I bought new guitar strings from Elixir."],
    "work": ["I shipped the billing service release at work.", "My manager asked me to lead {n} engineers.",
             "I interviewed {n} candidates for the backend role.", "I fixed a database outage at the office."],
}


def sessions(user: str, n: int, seed: int = 0, start: datetime = datetime(2024, 1, 1, 9, 0),
             topic_len: int = 4) -> list[list[dict[str, Any]]]:
    """`n` sessions of `user`, three days apart, four user turns (each answered) on one topic per
    `topic_len` sessions."""
    rnd, names, out = random.Random(seed), list(TOPICS), []
    for s in range(n):
        lines, ts, sid = TOPICS[names[(s // topic_len) % len(names)]], start + timedelta(days=3 * s), f"{user}-s{s:03d}"
        rows = []
        for i in range(4):
            t = ts + timedelta(minutes=2 * i)
            text = " ".join(rnd.choice(lines).format(n=rnd.randint(2, 60)) for _ in range(2))
            rows.append({"user_id": user, "session_id": sid, "message_id": f"{sid}-m{2 * i:02d}",
                         "speaker": user.capitalize(), "text": text, "timestamp": t.strftime("%Y-%m-%dT%H:%M:%SZ")})
            rows.append({"user_id": user, "session_id": sid, "message_id": f"{sid}-m{2 * i + 1:02d}",
                         "speaker": "assistant", "text": "That sounds great, tell me more.",
                         "timestamp": (t + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")})
        out.append(rows)
    return out


def part(path: Path, *groups: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for g in groups for r in g))
    return path


def ids(store: Store, table: str, user: str) -> set[str]:
    return set(store.read(table, user, columns=["id"]).column("id").to_pylist())


def chain(store: Store, user: str) -> tuple[list[str], set[tuple[str, str]]]:
    """The user's graph nodes in `seq` order and its temporal edges."""
    nodes = sorted(store.read("graph_nodes", user, columns=["seq", "node_id"]).to_pylist(), key=lambda r: r["seq"])
    edges = {(r["src_id"], r["dst_id"]) for r in store.read("graph_edges", user).to_pylist()}
    return [r["node_id"] for r in nodes], edges


def rebuilt(store: Store, dst: Path) -> Store:
    shutil.copytree(store.uri, dst)
    settings = Settings(store=str(dst), rebuild_graph=True)
    out = open_store(settings)
    consolidate(out, settings)
    return out


# -- 1. a crash, then an earlier session before the re-run ------------------------------------------
def test_a_rerun_after_a_crash_deletes_what_the_dead_run_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """s0-s5 consolidated; the run of s7 dies before its watermarks; s6 (dated before s7) and s8-s9
    arrive; the next run consolidates s6-s9. Every derived table equals a clean run's: the dead run's
    edge from the last old node to s7, its phase and its insights are gone, the chain is one."""
    s = sessions("carol", 10)
    base = part(tmp_path / "base.jsonl", *s[:6])
    crashed = ingest_and_consolidate(tmp_path / "crashed", base)
    ingest(crashed, part(tmp_path / "s7.jsonl", s[7]), "jsonl")
    with killed_before(monkeypatch, "watermarks"):
        consolidate(crashed, Settings(store=crashed.uri))
    add_part(crashed, part(tmp_path / "rest.jsonl", s[6], *s[8:]))
    clean = ingest_and_consolidate(tmp_path / "clean", base, part(tmp_path / "all.jsonl", *s[6:]))
    for table in ("graph_nodes", "graph_edges", "summaries", "insights", "links", "clusters", "topics"):
        assert ids(crashed, table, "carol") == ids(clean, table, "carol"), table
    nodes, edges = chain(crashed, "carol")
    assert edges == set(zip(nodes, nodes[1:]))
    assert max(Counter(a for a, _ in edges).values()) == 1
    consumed = {r["id"]: r["consumed_ts"] for r in clean.read("clusters", "carol").to_pylist()}
    assert {r["id"]: r["consumed_ts"] for r in crashed.read("clusters", "carol").to_pylist()} == consumed


# -- 2. a re-segmentation asks only the phases that changed ----------------------------------------
def test_a_resegmentation_keeps_the_unchanged_phases_and_asks_nothing_of_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = sessions("erin", 12)
    store = ingest_and_consolidate(tmp_path / "store", part(tmp_path / "a.jsonl", *s[:4]),
                                   part(tmp_path / "b.jsonl", *s[4:8]), part(tmp_path / "c.jsonl", *s[8:]))
    before = {r["id"]: r for r in store.read("summaries", "erin").to_pylist() if r["level"] == "phase"}
    asked: list[str] = []
    real = prompts.summarize_request

    def recording(phase: dict[str, Any]) -> LLMRequest:
        asked.append(phase["phase_id"])
        return real(phase)

    monkeypatch.setattr(prompts, "summarize_request", recording)
    first = s[0][-2]          # one more user turn in the first session: the user is re-segmented
    add_part(store, part(tmp_path / "x.jsonl", [dict(first, message_id="erin-s000-extra", text="I ran a half marathon "
                                                      "in the rain.", timestamp=first["timestamp"][:-3] + "30Z")]))
    after = {r["id"]: r for r in store.read("summaries", "erin").to_pylist() if r["level"] == "phase"}
    kept = before.keys() & after.keys()
    assert kept and asked                                  # some phases changed, some did not
    assert not kept & set(asked)                           # the unchanged ones were not asked again
    assert {i: after[i]["content"] for i in kept} == {i: before[i]["content"] for i in kept}
    assert sum(r["n_items"] for r in after.values()) == store.read("fragments", "erin").num_rows


def test_the_phase_prompt_names_no_position() -> None:
    items = [{"id": "f1", "date": "2024-01-01", "text": "running: ran 5 miles"}]
    a = prompts.summarize_request({"user_id": "u", "phase_id": "p", "start": "2024-01-01", "end": "2024-01-01",
                                   "items": items, "number": 1})
    b = prompts.summarize_request({"user_id": "u", "phase_id": "p", "start": "2024-01-01", "end": "2024-01-01",
                                   "items": items, "number": 7})
    assert a.cache_key("m") == b.cache_key("m") and "Cluster Activities (1 records" in a.messages[1]["content"]


# -- 3. new memories of the last woven node's time --------------------------------------------------
def test_a_turn_appended_to_the_latest_session_weaves_as_a_rebuild(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    store = ingest_and_consolidate(tmp_path / "store", part(tmp_path / "a.jsonl", [r for r in rows
                                                                                   if r["user_id"] == "alice"]))
    last = max((r for r in rows if r["user_id"] == "alice"), key=lambda r: r["timestamp"])
    extra = dict(last, message_id=last["message_id"] + "-extra", speaker="Alice",
                 text="I also adopted a cat named Luna last week, and I bought a new ukulele.")
    add_part(store, part(tmp_path / "b.jsonl", [extra]))
    assert chain(store, "alice") == chain(rebuilt(store, tmp_path / "rebuilt"), "alice")


# -- 3 and 4. two sessions starting at the same time ------------------------------------------------
def test_sessions_of_the_same_time_stay_apart_and_weave_as_a_rebuild(tmp_path: Path) -> None:
    s = sessions("dave", 2)
    tab = [dict(r, session_id="dave-tab2", message_id=r["message_id"].replace("s008", "tab2"), timestamp=t["timestamp"])
           for r, t in zip(sessions("dave", 12, seed=3)[8], s[1])]
    store = ingest_and_consolidate(tmp_path / "store", part(tmp_path / "a.jsonl", *s), part(tmp_path / "b.jsonl", tab))
    nodes, _ = chain(store, "dave")
    assert chain(store, "dave") == chain(rebuilt(store, tmp_path / "rebuilt"), "dave")
    frags = {r["id"]: r["session_id"] for r in store.read("fragments", "dave").to_pylist()}
    order = [frags[n] for n in nodes if n in frags]
    runs = [k for i, k in enumerate(order) if i == 0 or k != order[i - 1]]
    assert len(runs) == len(set(runs)) == 3              # each session's fragments in one stretch


# -- 5. the profile request is bounded ---------------------------------------------------------------
def test_the_profile_reads_the_most_recent_phases_within_its_budget() -> None:
    from memory.stages.summarize import PROFILE_MAX_CHARS, recent

    phases = [{"id": f"p{i}", "content": "x" * 5000} for i in range(10)]
    assert [p["id"] for p in recent(phases)] == [f"p{i}" for i in range(10 - PROFILE_MAX_CHARS // 5000, 10)]
    assert [p["id"] for p in recent(phases, 10)] == ["p9"]          # at least the last
    assert recent(phases[:2]) == phases[:2]
