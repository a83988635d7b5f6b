"""What is current when the links are imperfect or sit on turns (issue 12): of a replaced memory's
newer versions the one the query matches is put above it (a wrong link further down the chain is
not pulled in), and a contradiction recorded against a turn pairs and flags the turns themselves.
Real LanceDB, real embedder."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from memory.embed import Embedder
from memory.settings import RetrievalSettings
from memory.store import Store
from retrieval.retriever import Retriever
from tests.helpers import store_embedded

USER = "gia"
TURNS = [("t1", 1, "I submitted my cover letter to Greg for review on April 10 and I'm waiting for feedback."),
         ("t2", 8, "I've never submitted my cover letter to Greg for review, should I ask him?"),
         ("t3", 2, "I like green tea in the afternoon."), ("t4", 3, "My neighbour has a very loud parrot."),
         ("t5", 4, "We watched a documentary about whales."), ("t6", 5, "The printer at the office jams a lot.")]
# (id, message, day, content, superseded_by, contradicts_sources)
FRAGS: list[tuple[str, str, int, str, str | None, list[str] | None]] = [
    ("g1", "t1", 1, "Gia submitted her cover letter to Greg for review on April 10", None, ["t2"]),
    ("h0", "w0", 1, "Gia's weekly writing target is 1,200 words", "h1", None),
    ("h1", "w1", 3, "Gia adjusted her weekly writing target to 1,350 words", "h2", None),
    ("h2", "w2", 9, "Gia bought a red umbrella for the rainy season", None, None),   # a wrong link
]


def _ts(day: int) -> datetime:
    return datetime(2024, 5, day, 12, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> Store:
    st = Store(str(tmp_path_factory.mktemp("validity-turns") / "store"), dim=embedder.dim)
    msgs = [{"id": f"msg-{m}", "user_id": USER, "session_id": f"s{d}", "message_id": m, "seq": i, "speaker": "Gia",
             "text": t, "ts": _ts(d)} for i, (m, d, t) in enumerate(TURNS)]
    frags: list[dict[str, Any]] = []
    for fid, mid, day, content, sup, against in FRAGS:
        until = next((_ts(d).isoformat() for f, _, d, *_ in FRAGS if f == sup), None)
        frags.append({"id": fid, "user_id": USER, "session_id": f"s{day}", "session_ts": _ts(day), "subject": "Gia",
                      "category": "factual", "key": "", "content": content, "date": _ts(day).date().isoformat(),
                      "text": content, "source_ids": [mid], "valid_from": _ts(day).isoformat(),
                      "valid_until": until, "superseded_by": sup, "contradicts_sources": against,
                      "supersede_version": "test"})
    return store_embedded(st, embedder, msgs, frags)


def _on(st: Store, embedder: Embedder) -> Retriever:
    return Retriever(st, RetrievalSettings(validity=True), embedder)


def test_the_newer_version_the_query_matches_is_put_above(store: Store, embedder: Embedder) -> None:
    res = _on(store, embedder).retrieve(USER, "What is my weekly writing target in words?", k=3,
                                        strategy="familiarity")
    ids = res.ids
    assert "h1" in ids and "h0" in ids and ids.index("h1") < ids.index("h0")
    assert "h2" not in ids                      # the end of a wrong chain is not pulled in
    off = Retriever(store, RetrievalSettings(validity=False), embedder).retrieve(
        USER, "What is my weekly writing target in words?", k=3, strategy="familiarity")
    assert set(off.ids) >= {"h0", "h1"}


def test_a_contradiction_with_a_turn_flags_the_turns(store: Store, embedder: Embedder) -> None:
    res = _on(store, embedder).retrieve(USER, "Have I submitted my cover letter to Greg for review?", k=4,
                                        strategy="familiarity")
    by_id = {it.id: it for it in res.items}
    assert {"msg-t1", "msg-t2"} <= set(by_id)
    # the turns carry the flag against each other (not only against the fragment, which may be absent)
    assert by_id["msg-t2"].contradiction is not None and by_id["msg-t2"].contradiction["id"] in by_id
    assert {by_id["msg-t2"].contradiction["id"], "msg-t2"} & {"msg-t1", "g1"}
    assert "CONTRADICTS" in res.context()
