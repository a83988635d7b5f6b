"""Retrieval knows what is current (issue 12): a superseded memory ranks below its replacement (pulled
in when the strategy missed it), history stays retrievable, contradictions come in pairs, and
context() renders "since DATE (before: ...)" and the contradiction flag. Real LanceDB, real embedder."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memory.embed import Embedder
from memory.settings import RetrievalSettings
from memory.store import Store
from retrieval.context import build_context
from retrieval.retriever import Retriever
from retrieval.validity import asks_history, order_current, replacement, validity_of
from tests.helpers import store_embedded

USER = "erin"
# (message id, day, text, fragment key, fragment content, superseded_by, contradicts)
ROWS: list[tuple[str, int, str, str, str, str | None, str | None]] = [
    ("m0", 1, "My monthly rent is 1,200 dollars for the flat on Elm Street.", "monthly rent",
     "Erin pays a monthly rent of 1,200 dollars for the flat on Elm Street", "f3", None),
    ("m1", 2, "I ride my bike to work every morning along the river.", "commute",
     "Erin rides a bike to work every morning along the river", None, None),
    ("m2", 3, "I have been to Japan twice, Kyoto was my favourite city.", "travel Japan",
     "Erin has been to Japan twice and loved Kyoto", None, None),
    ("m3", 9, "Since the landlord raised it, my rent is now 1,450 dollars a month.", "rent increase",
     "Erin's landlord raised the rent, now 1,450 dollars a month", None, None),
    ("m4", 10, "I have never been to Japan, it is on my list.", "travel Japan",
     "Erin has never been to Japan", None, "f2"),
]
FILLER = ["I like green tea in the afternoon.", "My sister plays the cello in an orchestra.",
          "We watched a documentary about whales.", "The printer at the office jams a lot.",
          "I am learning to bake sourdough bread.", "My neighbour has a very loud parrot."]


def _ts(day: int) -> datetime:
    return datetime(2024, 5, day, 12, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def validity_store(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> Store:
    st = Store(str(tmp_path_factory.mktemp("validity") / "store"), dim=embedder.dim)
    msgs: list[dict[str, Any]] = []
    frags: list[dict[str, Any]] = []
    for i, (mid, day, text, key, content, sup, con) in enumerate(ROWS):
        msgs.append({"id": f"msg-{mid}", "user_id": USER, "session_id": f"s{day}", "message_id": mid, "seq": i,
                     "speaker": "Erin", "text": text, "ts": _ts(day)})
        until = next((_ts(d).isoformat() for m, d, *_ in ROWS if sup and f"f{m[1:]}" == sup), None)
        frags.append({"id": f"f{mid[1:]}", "user_id": USER, "session_id": f"s{day}", "session_ts": _ts(day),
                      "subject": "Erin", "category": "factual", "key": key, "content": content,
                      "date": _ts(day).date().isoformat(), "text": f"{key}: {content}", "source_ids": [mid],
                      "valid_from": _ts(day).isoformat(), "valid_until": until, "superseded_by": sup,
                      "contradicts": con, "supersede_version": "test"})
    for j, text in enumerate(FILLER):
        msgs.append({"id": f"msg-x{j}", "user_id": USER, "session_id": "s20", "message_id": f"x{j}",
                     "seq": 100 + j, "speaker": "Erin", "text": text, "ts": _ts(20)})
    return store_embedded(st, embedder, msgs, frags)


def _retriever(st: Store, embedder: Embedder, validity: bool) -> Retriever:
    return Retriever(st, RetrievalSettings(validity=validity), embedder)


def _rank(ids: list[str], memory_id: str) -> int:
    return ids.index(memory_id) if memory_id in ids else 10**6


@pytest.mark.parametrize("strategy", ["familiarity", "rfmem-hybrid"])
def test_superseded_ranks_below_its_replacement(validity_store: Store, embedder: Embedder, strategy: str) -> None:
    query = "How much is the monthly rent for the flat on Elm Street?"
    off = _retriever(validity_store, embedder, False).retrieve(USER, query, k=3, strategy=strategy)
    on = _retriever(validity_store, embedder, True).retrieve(USER, query, k=3, strategy=strategy)
    assert len(on.items) <= 3
    assert _rank(on.ids, "f3") < _rank(on.ids, "f0")                  # the current value first
    assert "f0" in off.ids or "msg-m0" in off.ids                     # the old value matched the query best
    old = next(it for it in on.items if it.id in ("f0", "msg-m0"))    # history stays retrievable
    assert old.id != "f0" or (old.superseded_by == "f3" and old.valid_until.startswith("2024-05-09"))
    current = next(it for it in on.items if it.id == "f3")
    assert current.history and current.history[0]["id"] == "f0" and current.superseded_by is None
    assert on.signals["validity"]["current_pulled"] >= (0 if "f3" in off.ids[:_rank(off.ids, "f0")] else 1)


def test_history_is_still_retrievable(validity_store: Store, embedder: Embedder) -> None:
    r = _retriever(validity_store, embedder, True)
    res = r.retrieve(USER, "What did I first say about my rent of 1,200 dollars?", k=5, strategy="familiarity")
    assert "f0" in res.ids and "f3" in res.ids


def test_contradictions_come_in_pairs_and_are_flagged(validity_store: Store, embedder: Embedder) -> None:
    res = _retriever(validity_store, embedder, True).retrieve(USER, "Have I ever been to Japan?", k=4,
                                                             strategy="familiarity")
    assert {"f2", "f4"} <= set(res.ids)
    flagged = [it for it in res.items if it.contradiction]
    assert {it.id for it in flagged} >= {"f2", "f4"}
    text = res.context()
    assert "CONTRADICTS" in text and "ask the user which holds" in text


def test_context_renders_current_value_with_history(validity_store: Store, embedder: Embedder) -> None:
    res = _retriever(validity_store, embedder, True).retrieve(USER, "What is my rent now?", k=4,
                                                             strategy="familiarity")
    text = res.context()
    line = next(ln for ln in text.splitlines() if "1,450" in ln and "(fragment)" in ln)
    assert "current since 2024-05-09 (before: monthly rent: Erin pays a monthly rent of 1,200" in line
    assert "[2024-05-01]" in line
    old = [ln for ln in text.splitlines() if "1,200" in ln and "1,450" not in ln and "(fragment)" in ln]
    assert all("no longer current since 2024-05-09" in ln for ln in old)
    # without validity the same items render as plain lines
    plain = _retriever(validity_store, embedder, False).retrieve(USER, "What is my rent now?", k=4,
                                                                strategy="familiarity")
    assert "current since" not in plain.context() and "CONTRADICTS" not in plain.context()
    assert build_context([]) == ""


def test_a_user_without_events_keeps_the_strategy_order(tmp_path: Path, embedder: Embedder) -> None:
    st = Store(str(tmp_path / "plain"), dim=embedder.dim)
    rows = [{"id": f"f{i}", "user_id": "finn", "session_id": "s", "session_ts": _ts(1), "subject": "Finn",
             "category": "factual", "key": t.split()[1], "content": t, "date": "2024-05-01", "text": t,
             "source_ids": [f"m{i}"]} for i, t in enumerate(FILLER)]
    for r, v in zip(rows, embedder.embed([r["text"] for r in rows])):
        r["vector"] = v
    st.upsert("fragments", rows)
    on = _retriever(st, embedder, True).retrieve("finn", "tea", k=4, strategy="familiarity")
    off = _retriever(st, embedder, False).retrieve("finn", "tea", k=4, strategy="familiarity")
    assert on.ids == off.ids and "validity" not in on.signals


def test_a_turn_that_contradicts_itself_is_shown_against_its_own_fragment(tmp_path: Path, embedder: Embedder) -> None:
    """The turn denies what it states and also an older turn: its row is shown against its own
    fragment (the plainest contradiction), even with the older turn's row returned beside it."""
    said = "I've never baked sourdough bread before, but I recently baked three sourdough loaves."
    msgs = [{"id": "msg-m1", "user_id": "gil", "session_id": "s1", "message_id": "m1", "seq": 0, "speaker": "Gil",
             "text": "I baked sourdough bread with my aunt last spring.", "ts": _ts(1)},
            {"id": "msg-m2", "user_id": "gil", "session_id": "s2", "message_id": "m2", "seq": 1, "speaker": "Gil",
             "text": said, "ts": _ts(5)}]
    frag = {"id": "g1", "user_id": "gil", "session_id": "s2", "session_ts": _ts(5), "subject": "Gil",
            "category": "experiential", "key": "sourdough bread", "content": "Gil has never baked sourdough bread",
            "date": "2024-05-05", "text": "sourdough bread: Gil has never baked sourdough bread", "source_ids": ["m2"],
            "valid_from": _ts(5).isoformat(), "contradicts_sources": ["m1", "m2"], "supersede_version": "test"}
    st = store_embedded(Store(str(tmp_path / "self"), dim=embedder.dim), embedder, msgs, [frag])
    res = _retriever(st, embedder, True).retrieve("gil", "Have I ever baked sourdough bread?", k=3,
                                                  strategy="familiarity")
    assert {"msg-m1", "msg-m2"} <= set(res.ids)
    turn = next(it for it in res.items if it.id == "msg-m2")
    assert turn.contradiction is not None and turn.contradiction["id"] == "g1"
    # the older turn it denies is shown too, and context() prints both on the turn's line
    assert [o["id"] for o in turn.also_contradicts or []] == ["msg-m1"]
    line = next(ln for ln in res.context().splitlines() if ln.startswith("- [2024-05-05") and "(message)" in ln)
    assert "CONTRADICTS" in line and "; also [2024-05-01]" in line and "with my aunt" in line
    older = next(it for it in res.items if it.id == "msg-m1")
    assert older.contradiction is not None and older.contradiction["id"] in ("g1", "msg-m2")


def test_a_version_whose_turn_ranks_above_is_not_pulled_again(validity_store: Store, embedder: Embedder) -> None:
    """The turn m0 holds the replaced rent; its newer version f3 already ranks first, so neither f3
    nor its turn m3 is pulled above m0 again (a copy would only push an answer out of the k)."""
    r = _retriever(validity_store, embedder, True)
    index = r.cache.get(USER)
    row_of = index.row_of_id()
    vec = embedder.embed(["What is my monthly rent?"])[0]
    ranked = np.asarray([row_of["f3"], row_of["msg-m0"], row_of["msg-x0"], row_of["msg-x1"]], dtype=np.int64)
    rows, _, signals = order_current(index, ranked, np.linspace(1, 0.5, 4).astype(np.float32), vec, k=4)
    assert rows.tolist() == ranked.tolist() and signals["validity"]["current_pulled"] == 0
    # without the newer version above, the replaced turn gets it pulled in right above it
    rows, _, signals = order_current(index, ranked[1:], np.linspace(1, 0.5, 3).astype(np.float32), vec, k=3)
    assert signals["validity"]["current_pulled"] == 1 and rows[1] == row_of["msg-m0"]
    assert set(index.meta.column("source_ids")[int(rows[0])].as_py()) == {"m3"}


def test_nothing_of_a_kind_not_searched_is_pulled_in(validity_store: Store, embedder: Embedder) -> None:
    """Asked for messages only, the replaced turn's newer version comes as its turn (never as the
    fragment f3), and a contradiction's counterpart only if it is a message too."""
    r = _retriever(validity_store, embedder, True)
    for query in ("How much is the monthly rent for the flat on Elm Street?", "Have I ever been to Japan?"):
        for kinds in (["message"], ["fragment"]):
            res = r.retrieve(USER, query, k=4, strategy="familiarity", kinds=kinds)
            assert res.items and {it.kind for it in res.items} == {kinds[0]}, (query, kinds, res.ids)
    res = r.retrieve(USER, "How much is the monthly rent for the flat on Elm Street?", k=4, strategy="familiarity",
                     kinds=["message"])
    assert _rank(res.ids, "msg-m3") < _rank(res.ids, "msg-m0")


def test_a_turn_that_is_current_shows_its_own_date() -> None:
    """A raw turn carries no valid_from: "current since" takes the turn's date, not "undated"."""
    from types import SimpleNamespace

    from retrieval.context import validity_note

    turn = SimpleNamespace(valid_from=None, date=None, ts="2024-03-19T20:10:00+00:00", superseded_by=None,
                           contradiction=None, history=[{"text": "ran 8 miles", "date": "2024-03-02"}])
    assert validity_note(turn).startswith(", current since 2024-03-19 (before: ran 8 miles [2024-03-02])")


def test_a_query_about_what_held_before_keeps_the_replaced_value(validity_store: Store, embedder: Embedder) -> None:
    """"... at the start?" asks for the replaced value: no newer version is put above it; the same
    query without it gets the current value first."""
    r = _retriever(validity_store, embedder, True)
    before = r.retrieve(USER, "What monthly rent did I pay for the flat on Elm Street at the start?", k=2,
                        strategy="familiarity")
    assert before.ids[0] in ("f0", "msg-m0") and before.signals["validity"]["current_pulled"] == 0
    now = r.retrieve(USER, "What monthly rent do I pay for the flat on Elm Street?", k=2, strategy="familiarity")
    assert _rank(now.ids, "f3") < _rank(now.ids, "f0")


def test_asks_history_reads_the_question() -> None:
    for q in ("How many entries did I say my dataset includes at the start?", "What was my original deadline?",
              "What did I first say about my rent?", "What sport did I used to play?",
              "What was the limit before I changed it?"):
        assert asks_history(q), q
    for q in ("Which library have I used to parse the dates?", "What do I do at the start of each workday?",
              "How much do I pay at the beginning of every month?", "What is my rent now?",
              "What framework did you use to build it?", None):
        assert not asks_history(q), q


def test_a_pulled_in_version_pushes_the_last_row_out(validity_store: Store, embedder: Embedder) -> None:
    """A current version pulled in above its superseded one keeps the list at k: the last row goes
    (a pinned standing instruction is placed after this ordering, `retrieval.instructions`)."""
    r = _retriever(validity_store, embedder, True)
    idx = r.user_index(USER)
    vec = embedder.embed(["How much is the monthly rent for the flat on Elm Street?"])[0]
    row = idx.row_of_id()
    rows = np.asarray([row["f0"], row["msg-x0"], row["msg-x1"]], dtype=np.int64)
    scores = (idx.z[rows] @ vec).astype(np.float32)
    plain, _, _ = order_current(idx, rows, scores, vec, 3)
    assert plain.tolist() == [row["f3"], row["f0"], row["msg-x0"]]          # pulled in, the last cut


def test_a_newer_version_passes_a_floor_that_is_its_own_cosine(validity_store: Store, embedder: Embedder) -> None:
    """The floor is the result's least similar cosine, computed by another matrix product than the
    candidate's; when that least similar item is the newer version itself, float32 noise must not
    make it fail its own floor (the replaced value stayed first)."""
    r = _retriever(validity_store, embedder, True)
    index = r.cache.get(USER)
    row_of = index.row_of_id()
    vec = embedder.embed(["What is my monthly rent?"])[0]
    v = validity_of(index)
    best = float((index.z[[row_of["f3"], row_of["msg-m3"]]] @ vec).max())   # the candidates: f3 and its turn
    noisy = float(np.nextafter(np.float32(best), np.float32(2)))      # one float32 step above
    got = replacement(index, v, row_of["msg-m0"], vec, "msg-m0", ["m0"], row_of, row_sim=1.0, floor=noisy)
    assert got is not None and index.meta.column("source_ids")[got].as_py() == ["m3"]


def test_a_turn_holding_a_replaced_value_says_what_replaced_it(validity_store: Store, embedder: Embedder) -> None:
    """A replaced fragment reads "(no longer current since ...)"; its turn, returned as a raw turn,
    now says so too, with the current version's text and date (a tight budget may keep the old turn
    and drop the newer one: the note still gives the current value)."""
    r = _retriever(validity_store, embedder, True)
    res = r.retrieve(USER, "How much is the monthly rent for the flat on Elm Street?", k=4, strategy="familiarity",
                     kinds=["message"])
    old = next(it for it in res.items if it.id == "msg-m0")
    assert old.updated_by is not None and old.updated_by["id"] == "f3" and "1,450" in old.updated_by["text"]
    assert old.updated_by["date"] == "2024-05-09"
    line = next(ln for ln in res.context(max_tokens=2000).splitlines() if "1,200 dollars" in ln)
    assert "(updated [2024-05-09]: " in line and "1,450" in line
    assert all(it.updated_by is None for it in res.items if it.id != "msg-m0")   # m3 is current, m1 unrelated
