"""Standing instructions (`retrieval.instructions`): the user's best-matching "Always ... when I ask
about ..." turn takes a place in the result when the ranking left it out, only in a history where an
assistant speaks, and only when it matches the query well enough."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from memory.embed import Embedder
from memory.settings import load_settings
from memory.store import Store
from retrieval import RetrievalSettings, Retriever
from retrieval.instructions import CUE, instruction_rows, is_instruction
from tests.helpers import store_embedded, ts

QUERY = "How should I list the sources I used in my paper?"
#: (speaker, text): Zotero turns that share the query's words, the APA instruction that shares none
TURNS = [("user", "I've added 52 sources to my Zotero library, how can I organize them for my paper?"),
         ("assistant", "Use Zotero collections and tags to organize the sources of your paper."),
         ("user", "Always use APA 7th edition citation style when I ask about formatting references."),
         ("assistant", "Got it! I'll use APA 7th edition style whenever you ask about formatting references."),
         ("user", "I'm struggling to keep the 45 sources of my paper organized in Zotero."),
         ("user", "Never suggest paid tools when I ask about software for my garden planner."),
         ("user", "My paper needs at least 20 peer-reviewed sources by May."),
         ("assistant", "Start with your library's databases to find peer-reviewed sources for the paper.")]


def _messages(user: str, turns: list[tuple[str, str]]) -> list[dict[str, Any]]:
    return [{"id": f"{user}-m{i}", "user_id": user, "session_id": "s1", "message_id": f"m{i}", "seq": i,
             "speaker": sp, "text": text, "ts": ts(1)} for i, (sp, text) in enumerate(turns)]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> Store:
    st = Store(str(tmp_path_factory.mktemp("instructions") / "store"), dim=embedder.dim)
    store_embedded(st, embedder, _messages("ann", TURNS), [])
    # the same words said between two people: no assistant, so no standing instruction
    store_embedded(st, embedder, _messages("bo", [("Bo", t) if sp == "user" else ("Cy", t) for sp, t in TURNS]), [])
    return st


def _result(store: Store, embedder: Embedder, user: str, k: int = 3, **settings: Any) -> Any:
    r = Retriever(store, RetrievalSettings(refresh_ms=0, **settings), embedder=embedder)
    return r.retrieve(user, QUERY, k=k, strategy="dense")


def test_a_standing_instruction_is_told_from_statements_and_questions() -> None:
    for text in ("Always use APA style when I ask about references.", "never use emojis", "Please, always answer in French",
                 "From now on answer in metric units", "Going forward, answer in metric units",
                 "Whenever I ask about dates, use ISO format", "Every time I ask for code, please add tests.",
                 "Make sure to include version numbers.", "  \"Always cite sources\"", "Don't ever use emojis.",
                 "Remember to always cite APA.", "Always embed the chart.", "Never proceed without a backup.",
                 "Also, always cite your sources.", "Hi! From now on, use metric units.", "Never, ever use tabs.",
                 "When I ask about recipes, always include calories.", "I'd like you to always answer in French.",
                 "**Always** use metric.", "Always bring a checklist.", "Always have a backup ready.",
                 "Whenever I ask about dates, let's use ISO format.", "Never forget to cite the source.",
                 "Always be concise.", "Always feel free to ask clarifying questions.", "Don\u2019t ever use emojis.",
                 "Thanks! Oh and always use metric units.", "From now on, I want you to respond in Spanish.",
                 "Whenever I ask about Next.js, use the app router.", "When you give me code, add comments.",
                 "Make sure your code examples use Python 3.", "Always have tests in your code examples."):
        assert is_instruction(text), text
    for text in ("I always use APA style", "Is it always like that?", "Alwaysland is a town", "Sure, never mind",
                 "Never mind, I found the bug myself.", "Always wanted to try bouldering, where do I start?",
                 "Never been to Japan.", "Never had a dog.", "Always loved hiking.", "From now on I'm vegetarian.",
                 "Whenever I run the tests my laptop freezes, any idea why?", "Every time I deploy, Heroku times out.",
                 "Whenever I run tests, my laptop freezes.", "Always use tabs?",
                 "Whenever I deploy, everything breaks.", "Whenever I run tests, nothing happens.",
                 "Whenever I run the script, crashes happen.", "Whenever it rains, traffic is bad.",
                 "Whenever I'm stressed, running helps.", "Going forward, prices went up.",
                 "Never really liked coffee.", "Always thinking about the next project.", "Always so busy lately.",
                 "Never enough time in the day.", "Never have I seen such a mess.", "Always have been a night owl.",
                 "Never know what to cook.", "Always struggle with deadlines at work.",
                 "When I ran the script, it crashed.", "Always forget my keys.", "Always get confused by pointers.",
                 "Never can remember the difference between let and const.", "Always hungry after leg day.",
                 "Every time I try to push, git says permission denied.", "In the future, maybe I'll move to Berlin.",
                 "Never fully understood recursion.", "Never, ever again."):
        assert not is_instruction(text), text
    assert CUE.match("Never been to Japan.")         # the cue alone is not enough
    assert not is_instruction("please" + " " * 50_000 + "x") and not is_instruction("never" + " " * 50_000)


def test_instruction_rows_need_an_assistant_in_the_history(store: Store, embedder: Embedder) -> None:
    r = Retriever(store, RetrievalSettings(refresh_ms=0), embedder=embedder)
    ann = r.user_index("ann")
    turns = {row: m for m, row in ann.turn_rows().items()}
    assert sorted(turns[int(i)] for i in instruction_rows(ann, ("assistant",))) == ["m2", "m5"]
    assert instruction_rows(r.user_index("bo"), ("assistant",)).size == 0        # people talking
    assert instruction_rows(ann, ()).size == 0


def test_the_best_matching_instruction_takes_its_place(store: Store, embedder: Embedder) -> None:
    off = _result(store, embedder, "ann", instruction_slots=0)
    assert not any("m2" in it.source_ids for it in off.items)              # the ranking alone misses it
    res = _result(store, embedder, "ann")
    cited = [it.source_ids for it in res.items]
    assert len(res.items) == 3 and cited[-1] == ["m2"]                      # a short list gets it last
    assert [it.source_ids for it in off.items][:2] == cited[:2]             # the rest keeps its order
    assert res.signals["instructions"] == ["m2"]
    first = _result(store, embedder, "ann", instruction_rank=0)
    assert first.items[0].source_ids == ["m2"] and first.ids[1:] == off.ids[:2]
    assert not any("m5" in c for c in cited)                               # the garden rule matches less


def test_no_pin_when_present_unmatched_or_off_topic(store: Store, embedder: Embedder) -> None:
    many = _result(store, embedder, "ann", k=8, instruction_slots=0)
    assert any("m2" in it.source_ids for it in many.items)
    again = _result(store, embedder, "ann", k=8)
    assert again.ids == many.ids and "instructions" not in again.signals   # already ranked: nothing moves
    strict = _result(store, embedder, "ann", instruction_min_score=0.99)
    assert "instructions" not in strict.signals
    assert "instructions" not in _result(store, embedder, "bo").signals   # no assistant, no instruction
    r = Retriever(store, RetrievalSettings(refresh_ms=0), embedder=embedder)
    frag_only = r.retrieve("ann", QUERY, k=3, strategy="familiarity", kinds=["fragment"])
    assert frag_only.items == [] and "instructions" not in frag_only.signals  # turns not searched


def test_the_best_memory_stays_and_signals_name_what_is_shown(store: Store, embedder: Embedder) -> None:
    one = _result(store, embedder, "ann", k=1)
    assert one.ids == _result(store, embedder, "ann", k=1, instruction_slots=0).ids   # k=1: no place for it
    assert "instructions" not in one.signals
    two = _result(store, embedder, "ann", k=2, instruction_slots=5)                 # at most k - 1 places
    assert len(two.items) == 2 and two.items[1].source_ids == ["m2"] and two.signals["instructions"] == ["m2"]


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().retrieval.instruction_slots == 1
    monkeypatch.setenv("MNEMO_RETRIEVAL_INSTRUCTION_SLOTS", "0")
    assert load_settings().retrieval.instruction_slots == 0



def test_an_instruction_the_ranking_returned_fills_its_place(store: Store, embedder: Embedder) -> None:
    order = [it.source_ids[0] for it in _result(store, embedder, "ann", k=8, instruction_slots=0).items]
    k = order.index("m5")                                # the APA rule is ranked above k, the garden rule not
    assert 1 <= order.index("m2") < k
    ranked = _result(store, embedder, "ann", k=k, instruction_slots=0)
    one = _result(store, embedder, "ann", k=k, instruction_min_score=-1.0)
    assert one.ids == ranked.ids and "instructions" not in one.signals   # no second rule pushes a memory out
    two = _result(store, embedder, "ann", k=k, instruction_min_score=-1.0, instruction_slots=2)
    assert two.signals["instructions"] == ["m5"] and ["m5"] in [it.source_ids for it in two.items]


#: uma replaces her citation-style instruction; pia's first instruction turn also gives a deadline
#: that her next instruction turn moves (the deadline changes, her citation rule still holds)
CHANGED = {
    "uma": [("user", "Always use APA 7th edition citation style when I ask about formatting references."),
            ("assistant", "Got it, I will format your references in APA 7th edition style."),
            ("user", "I'm writing a thesis on urban heat islands in Phoenix and I keep my sources in Zotero."),
            ("assistant", "Zotero works well for keeping the sources of a thesis."),
            ("user", "From now on, use MLA 9th edition citation style instead of APA when I ask about "
                     "formatting references."),
            ("assistant", "Understood, MLA 9th edition it is."),
            ("user", "My advisor Dr. Ruiz wants the first chapter of my thesis by May 3."),
            ("assistant", "May 3 leaves a few weeks for the first chapter.")],
    "pia": [("user", "Always use APA 7th edition citation style when I ask about formatting references. "
                     "My thesis is due on May 3."),
            ("assistant", "Got it: APA 7th edition, and May 3 for the thesis."),
            ("user", "I'm writing a thesis on urban heat islands in Phoenix and I keep my sources in Zotero."),
            ("assistant", "Zotero works well for keeping the sources of a thesis."),
            ("user", "From now on, keep your answers under 200 words please. My thesis deadline has moved "
                     "to June 10."),
            ("assistant", "Short answers from now on, and June 10 it is."),
            ("user", "My advisor Dr. Ruiz wants the first chapter of my thesis soon."),
            ("assistant", "Let's plan the first chapter.")]}


def test_an_instruction_a_newer_one_replaced_is_not_pinned(tmp_path: Any, embedder: Embedder) -> None:
    """"From now on, use MLA ... instead of APA" closes the APA instruction (the rules' supersede
    stage, through a real consolidation): the place goes to the current instruction for a query
    that matches the old one best, also when the ranking returned the old one; the old one with
    validity off or for a query about what held before. A turn whose other statement changed keeps
    its rule."""
    import json

    from retrieval.instructions import pin_instruction, replaced_instructions
    from tests.helpers import ingest_and_consolidate

    rows = [{"user_id": user, "session_id": f"s{1 + i // 4}", "message_id": f"m{i}", "speaker": sp, "text": text,
             "timestamp": f"2024-0{3 + i // 4}-01T10:{i:02d}:00Z"}
            for user, turns in CHANGED.items() for i, (sp, text) in enumerate(turns)]
    archive = tmp_path / "changed.jsonl"
    archive.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    store = ingest_and_consolidate(tmp_path / "store", archive)
    retriever = Retriever(store, RetrievalSettings(refresh_ms=0), embedder=embedder)
    assert replaced_instructions(retriever.user_index("uma"), ("assistant",)) == {"m0"}
    assert replaced_instructions(retriever.user_index("pia"), ("assistant",)) == frozenset()

    index = retriever.user_index("uma")
    turn = index.turn_rows()
    vec = embedder.embed(["Which APA 7th edition rules apply to my reference list?"])[0]

    def pinned(ranked: list[str], validity: bool = True, history: bool = False) -> Any:
        signals: dict[str, Any] = {}
        got, _ = pin_instruction(index, np.asarray([turn[m] for m in ranked], dtype=np.int64),
                                 np.ones(len(ranked), np.float32), vec, 3, RetrievalSettings(validity=validity),
                                 ("message", "fragment"), signals, history=history)
        return signals.get("instructions"), got.tolist()
    assert pinned(["m6", "m7"]) == (["m4"], [turn["m6"], turn["m7"], turn["m4"]])
    assert pinned(["m6", "m0"]) == (["m4"], [turn["m6"], turn["m0"], turn["m4"]])   # the old one fills nothing
    assert pinned(["m6", "m7"], validity=False) == (["m0"], [turn["m6"], turn["m7"], turn["m0"]])
    assert pinned(["m6", "m7"], history=True)[0] == ["m0"]
