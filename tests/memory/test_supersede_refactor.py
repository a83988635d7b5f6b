"""`supersede_user` with an embedder makes the change fragments the stage makes (for stored turns
too), once; the shared pieces behind it: the quantity index, the turns' nearest-first cache and the
one-sentence fragment item. Real LanceDB and the real embedder."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from memory.embed import Embedder
from memory.llm.rules.statements import sentence_item
from memory.llm.rules.supersede import SUPERSEDE_VERSION, quantities
from memory.llm.rules.turns import QuantityIndex, Turns, plan_turns
from memory.stages.shard import SessionWork
from memory.stages.supersede import change_fragments, supersede_user
from memory.store import Store
from tests.helpers import ingest_and_consolidate

TEXTS = [("s1", "m0", 1, "I adopted a grey cat called Miso from the shelter near my flat last winter."),
         ("s1", "m1", 1, "I have a Zoom meeting with Professor Danielle on March 22 at 3 PM, what should I ask her?"),
         ("s1", "m3", 2, "How do I use the advice I got from Bryan at the film festival in my personal statement?"),
         ("s2", "m2", 5, "Can you remind me that the Zoom meeting with Professor Danielle is rescheduled to "
                         "March 22 at 4:30 PM?"),
         ("s2", "m4", 6, "I've never met Bryan at any film festival and never got advice from him, can you help me "
                         "say so in my personal statement?")]


def _ts(day: int) -> datetime:
    return datetime(2024, 4, day, 9, tzinfo=timezone.utc)


def _store(tmp_path: Path, embedder: Embedder) -> tuple[Store, list[dict[str, Any]]]:
    """Two stored sessions of Dana's whose only fragment (unexamined) is about her cat: the changes
    between the turns are held by no fragment."""
    st = Store(str(tmp_path / "store"), dim=embedder.dim)
    vecs = embedder.embed([t for *_, t in TEXTS])
    msgs = [{"id": f"msg-{m}", "user_id": "dana", "session_id": s, "message_id": m, "seq": i, "speaker": "Dana",
             "text": t, "ts": _ts(d), "vector": v} for i, ((s, m, d, t), v) in enumerate(zip(TEXTS, vecs))]
    st.upsert("messages", msgs)
    st.upsert("sessions", [{"id": f"ses-{s}", "user_id": "dana", "session_id": s, "ts": _ts(d), "n_messages": 3,
                            "speakers": ["Dana"]} for s, d in (("s1", 1), ("s2", 5))])
    cat = "Dana adopted a grey cat called Miso from the shelter near her flat last winter"
    st.upsert("fragments", [{"id": "f0", "user_id": "dana", "session_id": "s1", "session_ts": _ts(1),
                             "subject": "Dana", "category": "factual", "key": "cat", "content": cat,
                             "date": "2024-04-01", "text": cat, "source_ids": ["m0"], "vector": vecs[0]}])
    return st, msgs


def test_supersede_user_with_an_embedder_makes_change_fragments_once(tmp_path: Path, embedder: Embedder) -> None:
    st, msgs = _store(tmp_path, embedder)
    counts = supersede_user(st, "dana", embedder=embedder)
    assert counts["examined"] == 1 and counts["change_fragments"] == 2
    made = {r["source_ids"][0]: r for r in st.read("fragments", "dana").to_pylist() if r["id"] != "f0"}
    assert set(made) == {"m2", "m4"}
    assert made["m2"]["replaces_sources"] == ["m1"] and "4:30 PM" in made["m2"]["content"]
    assert made["m4"]["contradicts_sources"] == ["m3"] and made["m4"]["replaces_sources"] is None
    assert {r["session_id"] for r in made.values()} == {"s2"}
    assert all(r["supersede_version"] == SUPERSEDE_VERSION and r["vector"] is not None for r in made.values())
    # the very rows the stage makes of these turns
    unheld: list[tuple[str, str, str, str]] = []
    plan_turns([], ["m2", "m4"], Turns(msgs), unheld=unheld)
    stage = change_fragments(unheld, [SessionWork(user_id="dana", session_id="s2", ts=_ts(5), messages=msgs[3:])],
                             embedder, "r1")
    assert sorted(r["id"] for r in stage) == sorted(r["id"] for r in made.values())
    # a second run examines nothing; decided again, the change fragments hold the links: no duplicate
    assert supersede_user(st, "dana", embedder=embedder)["examined"] == 0
    rows = st.read("fragments", "dana").to_pylist()
    st.upsert("fragments", [{**r, "supersede_version": None} for r in rows if r["id"] == "f0"])
    again = supersede_user(st, "dana", embedder=embedder)
    assert again["examined"] == 1 and again["change_fragments"] == 0
    after = st.read("fragments", "dana").to_pylist()
    assert sorted(r["id"] for r in after) == sorted(r["id"] for r in rows)
    assert {r["id"]: r["replaces_sources"] for r in after} == {r["id"]: r["replaces_sources"] for r in rows}


def test_supersede_user_without_an_embedder_makes_none(tmp_path: Path, embedder: Embedder) -> None:
    st, _ = _store(tmp_path, embedder)
    assert supersede_user(st, "dana")["change_fragments"] == 0
    assert [r["id"] for r in st.read("fragments", "dana").to_pylist()] == ["f0"]


def test_quantity_index_counts_keys_per_item_or_per_quantity() -> None:
    """Fragments count once per quantity, turns once per key; a unitless number of the query also
    matches context words as units (turns)."""
    one = quantities("My dashboard API response time is 420ms under load")
    per = QuantityIndex()
    per.add(0, one)
    per.add(1, one + one)
    distinct = QuantityIndex(distinct=True)
    distinct.add(0, one)
    distinct.add(1, one + one)
    assert per.ranked(one)[0] == 1 and sorted(distinct.ranked(one)) == [0, 1]
    commits = QuantityIndex(distinct=True)
    commits.add(0, quantities("My Git repository has 150 commits merged into the main branch"))
    now = quantities("The main branch commits merged are now 165 in my repository")      # unitless
    assert commits.ranked(now) == [] and commits.ranked(now, unitless_as_units=True) == [0]


def test_replaced_then_contradicted_searches_once(embedder: Embedder) -> None:
    vecs = embedder.embed([t for *_, t in TEXTS])
    turns = Turns([{"message_id": m, "speaker": "Dana", "text": t, "ts": _ts(d), "vector": v}
                   for (_, m, d, t), v in zip(TEXTS, vecs)])
    first = turns._nearest(vecs[3])
    assert np.array_equal(first[0], turns.z @ vecs[3]) and first[1] == np.argsort(-(turns.z @ vecs[3])).tolist()
    assert turns._nearest(np.array(vecs[3], copy=True))[0] is first[0]          # the same vector: kept
    assert turns._nearest(vecs[4])[0] is not first[0]


def test_sentence_item_is_extractions_wording() -> None:
    item = sentence_item("I moved to Lisbon last month", "Dana", "2024-04-05T09:00:00+00:00", "m9")
    assert item["subject"] == "Dana" and item["source_ids"] == ["m9"] and "Lisbon" in item["content"]
    assert set(item) == {"subject", "category", "key", "content", "source_ids", "date"}


def test_change_fragments_made_in_one_run_are_decided_against_each_other(tmp_path: Path,
                                                                          embedder: Embedder) -> None:
    """A meeting moved twice, each time inside a question (no fragment holds either time): the run
    makes a change fragment of each move, and the later one replaces the earlier one, as it would
    had the earlier been made in an earlier run (made after the decisions, it was compared with none)."""
    texts = [("s1", "m1", 1, "I have a Zoom meeting with Professor Danielle on March 22 at 3 PM, what should I ask her?"),
             ("s2", "m2", 5, "Can you remind me that the Zoom meeting with Professor Danielle is rescheduled to "
                             "March 22 at 4:30 PM?"),
             ("s3", "m3", 9, "Can you remind me that the Zoom meeting with Professor Danielle is rescheduled again "
                             "to March 22 at 5:30 PM?")]
    st = Store(str(tmp_path / "store"), dim=embedder.dim)
    vecs = embedder.embed([t for *_, t in texts])
    st.upsert("messages", [{"id": f"msg-{m}", "user_id": "dana", "session_id": s, "message_id": m, "seq": i,
                            "speaker": "Dana", "text": t, "ts": _ts(d), "vector": v}
                           for i, ((s, m, d, t), v) in enumerate(zip(texts, vecs))])
    st.upsert("sessions", [{"id": f"ses-{s}", "user_id": "dana", "session_id": s, "ts": _ts(d), "n_messages": 1,
                            "speakers": ["Dana"]} for s, _, d, _ in texts])
    cat = "Dana adopted a grey cat called Miso from the shelter near her flat last winter"
    st.upsert("fragments", [{"id": "f0", "user_id": "dana", "session_id": "s1", "session_ts": _ts(1),
                             "subject": "Dana", "category": "factual", "key": "cat", "content": cat,
                             "date": "2024-04-01", "text": cat, "source_ids": ["m0"],
                             "vector": embedder.embed([cat])[0]}])
    counts = supersede_user(st, "dana", embedder=embedder)
    assert counts["change_fragments"] == 2
    made = {r["source_ids"][0]: r for r in st.read("fragments", "dana").to_pylist() if r["id"] != "f0"}
    assert made["m2"]["replaces_sources"] == ["m1"] and "m2" in made["m3"]["replaces_sources"]
    assert made["m2"]["superseded_by"] == made["m3"]["id"] and made["m3"]["superseded_by"] is None
    assert counts["superseded"] == 1


def test_the_stage_decides_the_change_fragments_of_its_run(tmp_path: Path) -> None:
    """The same twice-moved meeting through a real consolidation (one run, three sessions): the
    stage's change fragment of the first move is replaced by the one of the second."""
    rows = [{"user_id": "dana", "session_id": s, "message_id": m, "speaker": "Dana", "text": t,
             "timestamp": _ts(d).isoformat()} for s, m, d, t in [
                 ("s1", "m1", 1, "I have a Zoom meeting with Professor Danielle on March 22 at 3 PM, what should I ask "
                                 "her?"),
                 ("s2", "m2", 5, "Can you remind me that the Zoom meeting with Professor Danielle is rescheduled to "
                                 "March 22 at 4:30 PM?"),
                 ("s3", "m3", 9, "Can you remind me that the Zoom meeting with Professor Danielle is rescheduled "
                                 "again to March 22 at 5:30 PM?")]]
    archive = tmp_path / "dana.jsonl"
    archive.write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = ingest_and_consolidate(tmp_path / "store", archive, llm="rules")
    made = {r["source_ids"][0]: r for r in store.read("fragments", "dana").to_pylist() if r["replaces_sources"]}
    assert {"m2", "m3"} <= set(made)
    assert made["m2"]["superseded_by"] == made["m3"]["id"] and made["m3"]["superseded_by"] is None
