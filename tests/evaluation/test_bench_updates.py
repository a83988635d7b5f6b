"""`mnemo bench updates`: on one BEAM 100K development chat (messages shortened, every id and question
kept) the figures print with validity on and off, a kept store is reused (nothing consolidated or
examined again), and a missing scale is a ConfigError; the contradiction figures over the questions
with two distinct statements, and the undecidable update-first questions, are printed beside."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from evaluation.updates import bench_updates, cr_figures, flagged, report
from retrieval.retriever import RetrievalResult, RetrievedItem
from memory.errors import ConfigError
from tests.evaluation.test_bench_beam import CHAT, shortened_copy


@pytest.mark.skipif(not (CHAT / "chat.json").is_file(), reason="BEAM development data not present")
def test_bench_updates_on_one_100k_chat(tmp_path: Path) -> None:
    shortened_copy(CHAT, tmp_path / "data" / "100K" / "1")
    store = tmp_path / "stores"
    out = bench_updates(str(tmp_path / "data"), scales=["100K"], store=str(store))
    assert "BEAM 100K updates: 1 chats, 2 knowledge_update and 2 contradiction_resolution" in out
    for label in ("update-first (KU, top-10)", "CR both + flagged in context()", "overall R@10 (every ability)"):
        row = next(ln for ln in out.splitlines() if ln.startswith(f"| {label} |"))
        on, off = (float(x) for x in row.split("|")[2:4])
        assert 0.0 <= on <= 1.0 and 0.0 <= off <= 1.0
    assert "CR questions naming one message for both statements: " in out
    assert "KU questions undecidable for update-first" in out and "| update-first, the " in out
    assert (store / "100K").is_dir()
    again = bench_updates(str(tmp_path / "data"), scales=["100K"], store=str(store))
    assert "examined now {'examined': 0," in again                          # decided once, kept
    assert re.findall(r"\| update-first.*", again) == re.findall(r"\| update-first.*", out)
    with pytest.raises(ConfigError):
        bench_updates(str(tmp_path / "data"), scales=["500K"])


def test_flagged_counts_a_counterpart_that_context_shows() -> None:
    """A contradiction is flagged when context() shows it against a memory citing the other side:
    that memory need not be a returned item (a turn that contradicts itself is shown against its
    own fragment); without a way to look its sources up, only returned counterparts count."""
    said = RetrievedItem(id="msg-58", kind="message", text="user: I've never tried it, but I recently did it",
                         score=0.9, date="2024-04-01", source_ids=["58"],
                         contradiction={"id": "frag-1", "text": "user has never tried it", "date": "2024-04-01"})
    other = RetrievedItem(id="msg-3", kind="message", text="user: I like tea", score=0.5, date="2024-03-01",
                          source_ids=["3"])
    res = RetrievalResult(user_id="u", query="have I tried it?", strategy="rfmem-hybrid", k=10, items=[said, other])
    sources = {"frag-1": ["58"], "frag-2": ["7"]}
    assert flagged(res, {"58"}, {"58"}, lambda mid: sources.get(mid, []))
    assert not flagged(res, {"58"}, {"58"})                       # frag-1 is not returned
    assert not flagged(res, {"58"}, {"3"}, lambda mid: sources.get(mid, []))   # its counterpart cites 58, not 3
    said.also_contradicts = [{"id": "msg-3", "text": "user: I like tea", "date": "2024-03-01"}]
    assert flagged(res, {"58"}, {"3"})                            # a further counterpart, returned


def test_flagged_needs_the_pair_in_the_context_the_assistant_gets() -> None:
    """The flagged item must be among those the default context() shows (a long one its budget
    cuts is not shown, though a 4000-token context once counted it), and another pair's
    contradiction shown beside does not count for this one; a pinned profile citing both sides is
    no "both in the top 10"."""
    from evaluation.updates import top_sources

    long = RetrievedItem(id="f1", kind="fragment", text="word " * 1500, score=1.0, date="2024-03-01",
                         source_ids=["10"], contradiction={"id": "f2", "text": "B says otherwise", "date": "2024-03-05"})
    b = RetrievedItem(id="f2", kind="fragment", text="B says otherwise", score=0.9, date="2024-03-05",
                      source_ids=["20"])
    other = RetrievedItem(id="x1", kind="fragment", text="unrelated", score=0.5, date="2024-04-01", source_ids=["99"],
                          contradiction={"id": "x2", "text": "unrelated other", "date": "2024-04-02"})
    res = RetrievalResult(user_id="u", query="q", strategy="s", k=10, items=[long, b, other])
    assert "CONTRADICTS" in res.context() and not flagged(res, {"10"}, {"20"})
    long.text = "A says so"
    assert flagged(res, {"10"}, {"20"})
    profile = RetrievedItem(id="profile-u", kind="summary", key="user profile", text="a profile", score=1.0, date="2024-05-01",
                            source_ids=["10", "20"])
    assert top_sources(RetrievalResult(user_id="u", query="q", strategy="s", k=10, items=[profile, other])) == {"99"}


def test_questions_naming_one_message_for_both_statements_are_counted_apart() -> None:
    """One message for both statements finds "both" as soon as it is found: the figures over every
    question stay as printed, and those over the questions with two statements print beside them."""
    both = [True, True, True, False, True]
    flag = [True, False, True, False, False]
    same = [True, True, False, False, False]     # the first two name one message for both
    f = cr_figures(both, flag, same)
    assert f["CR n"] == 5 and f["CR same n"] == 2
    assert f["CR both"] == 0.8 and f["CR flagged"] == 0.4                       # as printed before
    assert f["CR both 2"] == 2 / 3 and f["CR flagged 2"] == 1 / 3               # the 3 with two statements
    figures = {**f, "update-first": 0.5, "uf decidable": 2 / 3, "uf undecidable": 1, "uf n": 4, "KU n": 4,
               "updated R@10": 1.0, "KU R@10": 1.0, "R@10": 0.5}
    text = report({"scale": "100K", "chats": 1, "questions": 9, "figures": {"on": figures, "off": figures},
                   "counts": {"fragments": 0, "superseded": 0, "contradicts": 0}, "examined": {}, "prep_s": 0.0})
    assert ("CR questions naming one message for both statements: 2 of 5; over the 3 with two (validity on): "
            "both 0.667, flagged 0.333") in text
    assert "| CR both statements in top-10 | 0.800 |" in text
    assert "| CR both statements in top-10, the 3 with two | 0.667 |" in text
    assert "undecidable for update-first (the updated message is an original one too: never first): 1 of 4" in text
    assert "| update-first (KU, top-10) | 0.500 |" in text
    assert "| update-first, the 3 decidable KU questions | 0.667 |" in text
