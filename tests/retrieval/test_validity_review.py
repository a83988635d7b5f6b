"""What is current along a chain of replacements and beyond fragments (issue 12, review RN19): a replaced
memory gets the chain's current end above it, not only an intermediate version that is itself replaced; an
insight or topic restating a replaced turn says what replaced it; a newer version is chosen among the
searched kinds only; and a replaced line never reads "current since". Real LanceDB, real embedder."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import numpy as np
import pytest

from memory.embed import Embedder
from memory.settings import RetrievalSettings
from memory.store import Store
from retrieval.context import format_item
from retrieval.retriever import RetrievedItem, Retriever
from retrieval.validity import newer_chain, order_current, validity_of
from tests.helpers import store_embedded

USER, GUS = "erin", "gus"
RENT = "What is my monthly rent for the flat?"
# (message id, day, turn, fragment key, fragment content): f0 -> f1 -> f2, each replaced by the next
CHAIN = [("m0", 1, "My monthly rent is 1,200 dollars for the flat.", "monthly rent",
          "Erin's monthly rent is 1,200 dollars"),
         ("m1", 5, "The landlord raised my monthly rent for the flat to 1,450 dollars.", "monthly rent",
          "Erin's monthly rent is 1,450 dollars"),
         ("m2", 9, "Rent changed again: I pay 1,600 now.", "rent", "Erin pays 1,600 now")]
FILLER = ["I like green tea in the afternoon.", "My sister plays the cello in an orchestra.",
          "We watched a documentary about whales.", "I am learning to bake sourdough bread."]


def _ts(day: int) -> datetime:
    return datetime(2024, 5, day, 12, 0, tzinfo=timezone.utc)


def _turn(user: str, mid: str, day: int, text: str, seq: int) -> dict[str, Any]:
    return {"id": f"{user}-{mid}", "user_id": user, "session_id": f"s{day}", "message_id": f"{user}:{mid}",
            "seq": seq, "speaker": user.title(), "text": text, "ts": _ts(day)}


def _fragment(user: str, fid: str, mid: str, day: int, key: str, content: str, sup: str | None,
              until: int | None) -> dict[str, Any]:
    return {"id": fid, "user_id": user, "session_id": f"s{day}", "session_ts": _ts(day), "subject": user.title(),
            "category": "factual", "key": key, "content": content, "date": _ts(day).date().isoformat(),
            "text": f"{key}: {content}", "source_ids": [f"{user}:{mid}"], "valid_from": _ts(day).isoformat(),
            "valid_until": _ts(until).isoformat() if until else None, "superseded_by": sup,
            "supersede_version": "test"}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> Store:
    st = Store(str(tmp_path_factory.mktemp("validity-review") / "store"), dim=embedder.dim)
    msgs = [_turn(USER, mid, day, text, i) for i, (mid, day, text, *_) in enumerate(CHAIN)]
    msgs += [_turn(USER, f"x{j}", 20, text, 10 + j) for j, text in enumerate(FILLER)]
    frags = [_fragment(USER, f"f{i}", mid, day, key, content, f"f{i + 1}" if i < 2 else None,
                       CHAIN[i + 1][1] if i < 2 else None) for i, (mid, day, _, key, content) in enumerate(CHAIN)]
    # gus: one replacement, whose newer turn matches the query better than its fragment does
    msgs += [_turn(GUS, "m0", 1, "My monthly rent is 1200 dollars for the flat", 0),
             _turn(GUS, "m1", 9, "The landlord raised it, my monthly rent is now 1450 dollars for the flat", 1)]
    msgs += [_turn(GUS, f"x{j}", 20, text, 10 + j) for j, text in enumerate(FILLER)]
    frags += [_fragment(GUS, "g0", "m0", 1, "monthly rent", "Gus pays a monthly rent of 1200 dollars", "g1", 9),
              _fragment(GUS, "g1", "m1", 9, "monthly rent", "Gus's monthly rent is now 1450 dollars", None, None)]
    store_embedded(st, embedder, msgs, frags)
    restating = {"source_ids": [f"{USER}:m0"], "session_ts": _ts(1), "date": "2024-05-01"}
    ins = {"id": "i0", "user_id": USER, "key": "housing costs", "content": "x", "parent_ids": ["f0"],
           "text": "housing costs: Erin pays a monthly rent of 1,200 dollars for the flat", **restating}
    top = {"id": "t0", "user_id": USER, "key": "rent",
           "text": "rent: Erin's monthly rent for the flat is 1,200 dollars", **restating}
    gus = {"user_id": GUS, "date": "2024-05-01", "session_ts": _ts(1)}
    gus_top = {"id": "gt0", "key": "rent", "text": "rent: Gus's monthly rent for the flat is 1200 dollars",
               "source_ids": [f"{GUS}:m0"], **gus}
    gus_tea = {"id": "gt1", "key": "tea", "text": "tea: Gus likes green tea in the afternoon",
               "source_ids": [f"{GUS}:x0"], **gus}
    for table, rows in (("insights", [ins]), ("topics", [top, gus_top, gus_tea])):
        for r, v in zip(rows, embedder.embed([r["text"] for r in rows])):
            r["vector"] = v
        st.upsert(table, rows)
    return st


def _on(st: Store, embedder: Embedder) -> Retriever:
    return Retriever(st, RetrievalSettings(validity=True), embedder)


@pytest.mark.parametrize("strategy", ["familiarity", "rfmem-hybrid"])
def test_a_chain_puts_its_current_end_above_not_an_intermediate(store: Store, embedder: Embedder,
                                                               strategy: str) -> None:
    """The query matches f0 and f1 best; f1 is itself replaced by f2: f2 (the current value) is put
    above f1, the version the query matched, and the answer context holds it, though the query
    matches it a little less."""
    off = Retriever(store, RetrievalSettings(validity=False), embedder).retrieve(
        USER, RENT, k=2, strategy=strategy, kinds=["fragment"])
    assert set(off.ids) == {"f0", "f1"}                          # the strategy alone misses the current one
    res = _on(store, embedder).retrieve(USER, RENT, k=2, strategy=strategy, kinds=["fragment"])
    assert res.ids == ["f2", "f1"], res.ids
    assert res.items[0].superseded_by is None and [h["id"] for h in res.items[0].history or []] == ["f1", "f0"]
    assert "1,600" in res.context()
    # with room for all three the intermediate version is kept, below the current one, and its
    # line says when it held, not that it is current
    three = _on(store, embedder).retrieve(USER, RENT, k=3, strategy=strategy, kinds=["fragment"])
    assert three.ids[0] == "f2" and set(three.ids) == {"f0", "f1", "f2"}
    line = next(ln for ln in three.context().splitlines() if "1,450" in ln and "(fragment)" in ln)
    assert ", from 2024-05-05 (before: " in line and "no longer current since 2024-05-09" in line
    assert "current since 2024-05-05" not in line


def test_the_versions_put_above_a_replaced_memory_end_with_the_current_one(store: Store,
                                                                         embedder: Embedder) -> None:
    """`newer_chain` itself: for f0 (chain f1, f2) and for a turn citing f0's message the newest
    version put above is f2 or its turn, never the intermediate f1 nor the turn f1 cites."""
    idx = _on(store, embedder).user_index(USER)
    v, row_of, vec = validity_of(idx), idx.row_of_id(), embedder.embed([RENT])[0]
    for memory_id, sources in (("f0", [f"{USER}:m0"]), (f"{USER}-m0", [f"{USER}:m0"])):
        row = row_of[memory_id]
        chain = newer_chain(idx, v, row, vec, memory_id, sources, row_of, float(idx.z[row] @ vec), 0.0, None)
        assert chain and chain[0] in (row_of["f2"], row_of[f"{USER}-m2"]), [
            idx.meta.column("id")[r].as_py() for r in chain]


def test_an_insight_and_a_topic_restating_a_replaced_turn_say_what_replaced_it(store: Store,
                                                                              embedder: Embedder) -> None:
    """The insight and the topic cite the turn whose value f1, then f2 replaced: they carry the current
    version (`updated_by`, the chain's end) and their context lines say so, as the raw turn's does."""
    res = _on(store, embedder).retrieve(USER, RENT, k=2, strategy="familiarity", kinds=["insight", "topic"])
    assert set(res.ids) == {"i0", "t0"}
    for it in res.items:
        assert it.updated_by is not None and it.updated_by["id"] == "f2" and it.updated_by["date"] == "2024-05-09"
        assert it.superseded_by is None and it.history is None
    lines = res.context().splitlines()[1:]
    assert len(lines) == 2 and all("(updated [2024-05-09]: rent: Erin pays 1,600 now)" in ln for ln in lines)
    turn = _on(store, embedder).retrieve(USER, RENT, k=1, strategy="familiarity", kinds=["message"]).items[0]
    assert turn.id == f"{USER}-m0" and turn.updated_by is not None and turn.updated_by["id"] == "f2"
    # a current fragment, and a turn with nothing replaced, get no note
    current = _on(store, embedder).retrieve(USER, RENT, k=3, strategy="familiarity", kinds=["fragment"])
    assert all(it.updated_by is None for it in current.items)


def test_a_newer_version_is_chosen_among_the_searched_kinds(store: Store, embedder: Embedder) -> None:
    """Gus's newer turn matches the query better than his newer fragment g1; searching fragments and
    topics only, g1 is put above the topic restating the old value (not the unsearchable turn,
    which used to leave nothing above it)."""
    r = _on(store, embedder)
    idx = r.user_index(GUS)
    v, row_of = validity_of(idx), idx.row_of_id()
    vec = embedder.embed(["what is the monthly rent for the flat"])[0]
    t0 = row_of["gt0"]
    assert float(idx.z[row_of[f"{GUS}-m1"]] @ vec) > float(idx.z[row_of["g1"]] @ vec)   # the turn matches best
    kinds = ("fragment", "topic")
    ranked = np.asarray([t0, row_of["g0"], row_of["gt1"]], dtype=np.int64)
    rows, _, signals = order_current(idx, ranked, (idx.z[ranked] @ vec).astype(np.float32), vec, 3, kinds=kinds)
    assert rows.tolist() == [row_of["g1"], t0, row_of["g0"]] and signals["validity"]["current_pulled"] == 1
    got = newer_chain(idx, v, t0, vec, "gt0", [f"{GUS}:m0"], row_of, float(idx.z[t0] @ vec), 0.0, kinds)
    assert got == [row_of["g1"]]


def test_a_replaced_version_that_replaced_another_is_not_called_current() -> None:
    """An intermediate version (it replaced one and was replaced) reads "from DATE (before: ...)
    (no longer current since ...)"; a current one still "current since DATE (before: ...)"."""
    old = {"id": "f0", "text": "rent: Erin's rent is 1200 dollars", "date": "2024-05-01"}
    mid = RetrievedItem(id="f1", kind="fragment", text="rent: Erin's rent is 1450 dollars", score=0.8,
                        date="2024-05-02", source_ids=["m1"], key="rent", valid_from="2024-05-02",
                        valid_until="2024-05-03", superseded_by="f2", history=[old])
    line = format_item(mid)
    assert line.count("current since") == 1          # only in "no longer current since"
    assert line.endswith("1450 dollars, from 2024-05-02 (before: rent: Erin's rent is 1200 dollars [2024-05-01]) "
                         "(no longer current since 2024-05-03)")
    mid.superseded_by = mid.valid_until = None
    assert ", current since 2024-05-02 (before: " in format_item(mid)
