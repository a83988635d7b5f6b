"""Queries about what the assistant said before (`retrieval.recall_cue`): the hybrid strategies
lift the assistant's raw turns by `recall_boost` for "What did you recommend ...?", not for a
request for new advice ("Can you recommend ...?"), and lower them by `own_words_penalty` for what
the user said ("What did I mention ...?")."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from memory.embed import Embedder
from memory.store import Store
from retrieval import RetrievalSettings, Retriever
from retrieval.recall_cue import asks_what_i_said, asks_what_you_said, assistant_turns
from tests.helpers import ts

USER = "dana"
TURNS = [("user", "My basil plant on the balcony keeps wilting and I keep forgetting to water it"),
         ("assistant", "Try a self-watering pot or a weekly phone reminder, and water herbs when the top "
                       "inch of soil feels dry."),
         ("user", "Thanks, I'll look for a pot this weekend.")]
ADVICE = f"{USER}-m1"


@pytest.mark.parametrize("text, asks", [
    ("How did you recommend structuring my sprint?", True),
    ("What approach did you recommend for my resume?", True),
    ("What was the plan you suggested last week?", True),
    ("Remind me what you'd told me about stretching", True),
    ("Have you ever mentioned a deadline?", True),
    ("What you\u2019ve suggested before", True),
    ("Didn't you recommend a pot?", True),
    ("Did you not suggest a tripod?", True),
    ("What was your recommendation for the pot?", True),
    ("What did you come up with for the title?", True),
    ("What happens if you told your boss?", False),
    ("What would you have recommended instead?", False),
    ("Were you told about the launch?", False),
    ("What is your advice on knees?", False),
    ("Can you recommend a good book?", False),
    ("Could you suggest a name for my cat?", False),
    ("What did I tell you about my sister?", False),
    ("What did Caroline say about the parade?", False),
    ("", False),
    (None, False),
])
def test_the_cue_is_a_past_tense_with_you_as_subject(text: str | None, asks: bool) -> None:
    assert asks_what_you_said(text) is asks


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> Store:
    st = Store(str(tmp_path_factory.mktemp("recall") / "store"), dim=embedder.dim)
    msgs: list[dict[str, Any]] = [
        {"id": f"{USER}-m{i}", "user_id": USER, "session_id": "s1", "message_id": f"m{i}", "seq": i,
         "speaker": sp, "text": text, "ts": ts(1)} for i, (sp, text) in enumerate(TURNS)]
    for m, v in zip(msgs, embedder.embed([f"{m['speaker']}: {m['text']}" for m in msgs])):
        m["vector"] = v
    chores = [{"id": f"lee-m{i}", "user_id": "lee", "session_id": "s1", "message_id": f"m{i}", "seq": i,
               "speaker": "user", "text": text, "ts": ts(1)}
              for i, text in enumerate(["I did the dishes after dinner", "My bike chain broke on the hill"])]
    for m, v in zip(chores, embedder.embed([m["text"] for m in chores])):
        m["vector"] = v
    st.upsert("messages", msgs + chores)
    return st


def _scores(store: Store, embedder: Embedder, query: str, **settings: Any) -> dict[str, float]:
    r = Retriever(store, RetrievalSettings(refresh_ms=0, instruction_slots=0, **settings), embedder=embedder)
    return {it.id: it.score for it in r.retrieve(USER, query, k=3, strategy="hybrid").items}


def test_the_mask_marks_only_the_assistants_raw_turns(store: Store, embedder: Embedder) -> None:
    idx = Retriever(store, RetrievalSettings(refresh_ms=0), embedder=embedder).user_index(USER)
    ids = idx.meta.column("id").to_pylist()
    assert [ids[i] for i in np.flatnonzero(assistant_turns(idx, ("Assistant",)))] == [ADVICE]
    assert not assistant_turns(idx, ()).any() and not assistant_turns(idx, ("bot",)).any()


def test_asking_what_the_assistant_recommended_lifts_its_turns(store: Store, embedder: Embedder) -> None:
    query = "What did you recommend for my basil plant that keeps wilting?"
    off = _scores(store, embedder, query, recall_boost=0.0)
    on = _scores(store, embedder, query)
    assert on[ADVICE] - off[ADVICE] == pytest.approx(0.1, abs=1e-5)               # the default boost
    assert {i: on[i] for i in on if i != ADVICE} == {i: off[i] for i in off if i != ADVICE}
    assert max(off, key=off.__getitem__) == f"{USER}-m0"                            # the user's own turn
    strong = _scores(store, embedder, query, recall_boost=0.7)
    assert max(strong, key=strong.__getitem__) == ADVICE


def test_a_request_for_new_advice_is_not_lifted(store: Store, embedder: Embedder) -> None:
    query = "Can you recommend something for my basil plant that keeps wilting?"
    assert _scores(store, embedder, query, recall_boost=0.7) == _scores(store, embedder, query, recall_boost=0.0)


def test_speakers_off_means_no_assistant_to_lift(store: Store, embedder: Embedder) -> None:
    query = "What did you recommend for my basil plant that keeps wilting?"
    assert (_scores(store, embedder, query, recall_boost=0.7, assistant_speakers=())
            == _scores(store, embedder, query, recall_boost=0.0, assistant_speakers=()))


def test_the_hybrid_bm25_leaves_the_questions_own_words_out(store: Store, embedder: Embedder) -> None:
    """"What did I say about ...": only the turn about the hill matches lexically, not the one that
    merely says "did" (`lexical.QUESTION_WORDS`)."""
    r = Retriever(store, RetrievalSettings(refresh_ms=0, instruction_slots=0), embedder=embedder)
    res = r.retrieve("lee", "What did I say about the hill?", k=2, strategy="hybrid")
    assert res.signals["lexical_hits"] == 1


@pytest.mark.parametrize("text, asks", [
    ("Can you list the order in which I brought up different aspects of my budget app?", True),
    ("What technologies did I say I was using?", True),
    ("What did I first mention about the deadline?", True),
    ("Have I ever told you about my sister?", True),
    ("I've mentioned my knee before, what stretches help?", True),
    ("Didn't I share the draft with you?", True),
    ("Should I mention my salary in the interview?", False),
    ("Should I have mentioned that to my landlord?", False),
    ("What should I have said to him?", False),
    ("Can you recap the workout plan I asked you for?", False),
    ("How much did I raise for the charity run?", False),
    ("If I mentioned it to my boss, what would happen?", False),
    ("How did I confirm the ratio was right?", False),
    ("What did you recommend for my resume?", False),
    ("", False),
    (None, False),
])
def test_the_own_words_cue_is_a_past_tense_with_i_as_subject(text: str | None, asks: bool) -> None:
    assert asks_what_i_said(text) is asks


def test_asking_what_the_user_said_lowers_the_assistants_turns(store: Store, embedder: Embedder) -> None:
    """"What did I say about ...": the user's own turns answer it; the assistant's reply, which
    restates them, drops by the default `own_words_penalty` and nothing else moves."""
    query = "What did I say about my basil plant that keeps wilting?"
    off = _scores(store, embedder, query, own_words_penalty=0.0)
    on = _scores(store, embedder, query)
    assert off[ADVICE] - on[ADVICE] == pytest.approx(0.2, abs=1e-5)
    assert {i: on[i] for i in on if i != ADVICE} == {i: off[i] for i in off if i != ADVICE}
    about_you = "What did you recommend for my basil plant that keeps wilting?"
    assert _scores(store, embedder, about_you, own_words_penalty=0.9) == _scores(store, embedder, about_you)
    both = "After I mentioned my basil plant, what did you recommend?"      # about the assistant's words
    plain = _scores(store, embedder, both, recall_boost=0.0, own_words_penalty=0.0)
    assert _scores(store, embedder, both, recall_boost=0.0) == plain
