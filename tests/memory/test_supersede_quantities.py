"""What `rules` counts as the same quantity (issue 12, rules-supersede-v4): dates and clock times are
their own kinds, a unitless number or a date changes only under a change cue, ratios are not
quantities; older turns are found by the quantity they hold, not only by vector; a store decided by
an older rules version is decided again. Real LanceDB and the real embedder where turns are involved."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import importlib

import pytest

from memory.embed import Embedder
from memory.llm.rules.supersede import SUPERSEDE_VERSION, decide, quantities
from memory.stages.shard import SessionWork
from memory.llm.rules.turns import Turns
from memory.llm.rules.turns import plan_turns as stage_plan_turns
from memory.stages.supersede import change_fragments, supersede_user
from memory.store import Store
from tests.helpers import statement

_f = statement


def test_dates_and_times_are_their_own_kinds() -> None:
    found = {(q.unit, q.value) for q in quantities("I have a Zoom meeting with Professor Danielle on March 22 "
                                                   "at 3 PM to review my draft")}
    assert found == {("date", 322.0), ("time", 900.0)}
    assert quantities("I scored 8/10 on the quiz and kept a 2:1 ratio in my notes") == []
    moved = _f("I'm worried about missing the Zoom meeting with Professor Danielle, it's rescheduled to "
               "March 22 at 4:30 PM", "m2")
    first = _f("I have a Zoom meeting with Professor Danielle on March 22 at 3 PM to review my draft", "m1")
    assert decide(moved, first, 0.5) == "update"
    # a date (or a time) is never compared with a plain number or an amount
    flat = _f("I secured a furnished apartment in Toronto for $1,100/month near the UWI campus", "m3")
    move = _f("I'm overwhelmed with my move to Toronto and my new orientation at UWI on September 2", "m4")
    assert decide(move, flat, 0.6) is None
    # a day range is one date: its second day is no bare number an amount could change
    ranged = {(q.unit, q.value) for q in quantities("I balanced interview prep and a workshop on May 3-4, 2024, "
                                                    "and cut social media by 3 hours daily")}
    assert ranged == {("date", 503.0), ("hour", 3.0)}
    five = _f("I'm kinda curious how I can leverage the fact that I secured 5 interviews to improve my resume", "m6")
    prep = _f("I'm trying to balance interview prep and a workshop, kinda like I did on May 3-4, 2024", "m5")
    assert decide(five, prep, 0.6) is None
    # the same period stated in both is one shared context word: another count for it is an update
    three = _f("I'm kinda worried that I only secured 3 interviews for executive producer roles between "
               "April 25 and May 1, 2024", "m7")
    again = _f("Between April 25 and May 1, 2024, I secured 5 interviews, how can I improve my resume?", "m8")
    later = _f("I secured 5 interviews and I want to improve my resume before the summer", "m9")
    assert decide(again, three, 0.6) == "update" and decide(later, three, 0.6) is None
    # sizes keep their unit; a change under way ("trying to adjust ... to") cues a date
    peak = _f("I'm trying to reduce the memory usage of my batch resume processing script, it uses 250MB", "m10")
    now = _f("My batch resume processing memory usage is averaging around 140MB per session", "m11")
    assert {q.unit for q in quantities(now["content"])} == {"mb"} and decide(now, peak, 0.6) == "update"
    due = _f("I need to set a sprint deadline of April 1, 2024 for the Instagram automation prototype", "m12")
    moving = _f("I'm trying to adjust the sprint deadline to April 5, 2024 for the Instagram automation prototype", "m13")
    assert decide(moving, due, 0.6) == "update"
    # rates of two periods are two quantities: words a day do not replace a weekly word count
    weekly = _f("I've increased my weekly word count from 1,200 to 1,500 words by April 9", "m14")
    daily = _f("How can I keep up this pace of averaging 1,700 words/day, like when I monitored my daily word count?",
               "m15")
    assert [q.per for q in quantities(weekly["content"]) if q.unit == "word"] == ["week", "week"]
    assert [q.per for q in quantities(daily["content"])] == ["day"]
    assert decide(daily, weekly, 0.7) is None
    more = _f("My weekly word count is now 1,800 words, up from the 1,500 words I had in April", "m16")
    assert decide(more, weekly, 0.7) == "update"


def test_a_unitless_number_or_a_date_needs_a_change_cue() -> None:
    met = _f("I'm worried that I met my final draft deadline on October 1, but now I have to query agents", "m1")
    exported = _f("I exported the final draft of my screenplay from Scrivener to PDF on October 2", "m2")
    assert decide(exported, met, 0.6) is None                      # two events, two dates: no change said
    old = _f("I'm worried about meeting my April 20 deadline for the peer-reviewed draft submission", "m3")
    new = _f("I'm worried that I won't meet the new April 25 deadline for the peer-reviewed draft", "m4")
    assert decide(new, old, 0.5) == "update"
    said = _f("My Git repository has 150 commits merged into the main branch so far", "m5")
    grown = _f("The commits merged into the main branch of my repository have now reached 165", "m6")
    plain = _f("The commits merged into the main branch of my repository were 165 at the review", "m7")
    assert decide(grown, said, 0.4) == "update" and decide(plain, said, 0.4) is None
    # a number with its unit needs no cue
    assert decide(_f("I have 52 sources in my Zotero library, tagged by theme", "m9"),
                  _f("My Zotero library has 45 sources tagged by theme and date", "m8"), 0.7) == "update"


def test_a_named_change_needs_the_cue_before_the_new_name() -> None:
    old = {"subject": "Dana", "key": "database", "content": "Dana uses SQLite for the budget tracker app",
           "source_ids": ["m1"]}
    new = {"subject": "Dana", "key": "database", "content": "Dana now uses PostgreSQL for the budget tracker app",
           "source_ids": ["m2"]}
    far = {"subject": "Dana", "key": "database", "content": "Dana now thinks the budget tracker app should run "
           "well for a long time on PostgreSQL", "source_ids": ["m3"]}
    assert decide(new, old, 0.8) == "update"
    assert decide(far, old, 0.8) is None                           # the cue does not govern the name


def test_a_named_change_needs_close_statements_and_a_replacement_cue() -> None:
    """v9 (an audit of v8: 2 of 71 named-value closings right): the same key no longer stands in for
    a close cosine, progress words ("recently upgraded") are no replacement cue, a cue inside a
    hyphenated name ("Flask-JWT-Extended") is none, and a weekday is no name; a name the newer
    statement says it left ("switched from Flask") still counts as dropped."""
    def f(text: str, mid: str, key: str = "") -> dict[str, Any]:
        return {"subject": "user", "key": key, "content": text, "source_ids": [mid]}
    mongo = f("user is experiencing issues with the MongoDB connection in the chat app", "m1", "experiencing issues")
    script = f("user is now experiencing issues with JavaScript code in the chat app", "m2", "experiencing issues")
    assert decide(script, mongo, 0.3) is None                       # same key, unrelated statements
    assert decide(f("user recently upgraded to Flask 2.3.3 for the object detection app", "m2"),
                  f("user is using OpenCV 4.7.0 and Python 3.10 for the object detection app", "m1"), 0.7) is None
    assert decide(f("user added Flask-JWT-Extended with Redis to handle tokens for the dashboard login", "m2"),
                  f("user is using Flask-Login to handle the dashboard login and sessions", "m1"), 0.7) is None
    assert decide(f("user now holds the team retrospectives every Monday afternoon in the office", "m2"),
                  f("user holds the team code reviews every Friday afternoon in the office", "m1"), 0.7) is None
    # real replacements still are: "switched from X to Y", a cue opening the sentence
    flask = _f("I built the backend of my budgeting app with Flask last spring", "m1")
    assert decide(_f("I switched from Flask to FastAPI for the backend of my budgeting app", "m2"), flask, 0.7) == "update"
    assert decide(_f("Now the budgeting app runs on FastAPI for its whole backend", "m2"),
                  _f("The budgeting app runs on Flask for its whole backend", "m1"), 0.7) == "update"


def test_a_turns_fragments_are_judged_at_the_turns_cosine() -> None:
    """v9: `plan_turns` judged the older turn's fragments at a cosine of 1.0, so any fragment of a turn
    found for one changed number could be closed by a named value; now at the two turns' cosine."""
    import numpy as np

    near = np.array([0.45, float(np.sqrt(1 - 0.45 ** 2))], dtype=np.float32)
    old_text = "My API latency is 60ms on staging. I host the budgeting app on Heroku with Postgres."
    new_text = "My API latency is now 45ms since I moved the budgeting app to Render."
    turns = Turns([{**_turn("m1", 1, old_text, np.array([1.0, 0.0], dtype=np.float32)), "id": "msg-m1"},
                   {**_turn("m2", 5, new_text, near), "id": "msg-m2"}])
    frags = [_frag("f1", "m1", 1, "Dana's API latency is 60ms on the staging server", np.zeros(2)),
             _frag("f2", "m1", 1, "Dana hosts the budgeting app on Heroku with Postgres", np.zeros(2))]
    stage_plan_turns(frags, ["m2"], turns)
    assert frags[0]["superseded_by"] == "msg-m2"                    # the changed number
    assert frags[1].get("superseded_by") is None                    # cosine 0.45: no named value change


def test_a_quoted_name_is_a_quotation_not_a_new_value() -> None:
    """v8: "now getting a “Rate limit exceeded” error" had replaced "using the API correctly"."""
    old = {"subject": "user", "key": "rate limits", "content": "user wants to make sure user is using the API "
           "correctly and handling the rate limits properly", "source_ids": ["m1"]}
    for quoted in ("“Rate limit exceeded”", '"Rate limit exceeded"', "'Rate limit exceeded'", "‘Rate limit exceeded’"):
        new = {"subject": "user", "key": "rate limits", "content": f"However, user is now getting a {quoted} "
               "error and user is not sure how to handle it", "source_ids": ["m2"]}
        assert decide(new, old, 0.8) is None, quoted
    nginx = {"subject": "user", "key": "rate limits", "content": "user's client uses Nginx to handle the "
             "rate limits", "source_ids": ["m3"]}
    kong = {"subject": "user", "key": "rate limits", "content": "user's client now uses Kong to handle the "
            "user's rate limits", "source_ids": ["m4"]}
    assert decide(kong, nginx, 0.8) == "update"                    # an apostrophe opens no quote
    for name in ('"Kong"', "'Kong'", "“Kong”"):                     # a quoted lone name is still a name
        quoted = {**kong, "content": f"user's client now uses {name} to handle the rate limits"}
        assert decide(quoted, nginx, 0.8) == "update", name


def _turn(mid: str, day: int, text: str, vec: Any, speaker: str = "Dana") -> dict[str, Any]:
    return {"message_id": mid, "speaker": speaker, "text": text, "vector": vec,
            "ts": datetime(2024, 4, day, 9, tzinfo=timezone.utc)}


def test_older_turns_are_found_by_the_quantity_they_hold(embedder: Embedder,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The original value sits in a long turn about something else (its vector is far): the
    quantity index still finds it, and only the nearest such turn is replaced."""
    texts = [("m1", 1, "Here's my Flask app factory, it registers the blueprints and the error handlers. "
                       "The dashboard API response time is 420ms on average under load. Can you check the code?"),
             ("m2", 2, "I adopted a grey cat called Miso from the shelter near my flat last winter."),
             ("m3", 3, "My sister plays the cello in an orchestra on weekends.")]
    vecs = embedder.embed([t for _, _, t in texts])
    turns = Turns([_turn(m, d, t, v) for (m, d, t), v in zip(texts, vecs)])
    said = "Dana says the dashboard API response time has recently improved to 250ms after the caching tweaks"
    new: dict[str, Any] = {"subject": "Dana", "key": "", "content": said, "source_ids": ["m9"]}
    vec = embedder.embed([said])[0]
    assert 0 in turns.same_quantity(new) and 1 not in turns.same_quantity(new)
    turns_module = importlib.import_module("memory.llm.rules.turns")
    monkeypatch.setattr(turns_module, "MESSAGE_NEIGHBOURS", 0)    # no vector neighbour at all
    assert turns.replaced(new, vec, "2024-04-10T00:00:00+00:00") == ["m1"]
    assert turns.replaced(new, vec, "2024-03-01T00:00:00+00:00") == []   # only older turns
    other = {**new, "subject": "Bob"}
    assert turns.replaced(other, vec, "2024-04-10T00:00:00+00:00") == []  # another speaker's turns


def test_an_older_rules_version_is_decided_again(tmp_path: Path, embedder: Embedder) -> None:
    st = Store(str(tmp_path / "store"), dim=embedder.dim)
    ts = [datetime(2024, 4, d, 9, tzinfo=timezone.utc) for d in (1, 2, 9)]
    texts = ["Dana's Git repository has 150 commits merged into the main branch so far",
             "Dana adopted a grey cat called Miso from the shelter near her flat",
             "Dana says the commits merged into the main branch have now reached 165"]
    rows = [{"id": f"f{i}", "user_id": "dana", "session_id": f"s{i}", "session_ts": t, "subject": "Dana",
             "category": "factual", "key": "", "content": c, "date": t.date().isoformat(), "text": c,
             "source_ids": [f"m{i}"], "valid_from": t.isoformat(), "supersede_version": "rules-supersede-v1"}
            for i, (t, c) in enumerate(zip(ts, texts))]
    rows[1]["superseded_by"] = "f2"                                 # a wrong v1 decision
    rows.append({**rows[1], "id": "f3", "source_ids": ["m3"], "superseded_by": "f2",
                 "supersede_version": "premem-reason-v2"})           # an LLM decision: kept
    for r, v in zip(rows, embedder.embed([str(r["text"]) for r in rows])):
        r["vector"] = v
    st.upsert("fragments", rows)
    counts = supersede_user(st, "dana")
    assert counts["examined"] == 3 and counts["superseded"] == 1
    got = {r["id"]: r for r in st.read("fragments", "dana").to_pylist()}
    assert got["f0"]["superseded_by"] == "f2" and got["f1"]["superseded_by"] is None
    assert got["f3"]["superseded_by"] == "f2" and got["f3"]["supersede_version"] == "premem-reason-v2"
    assert {got[f]["supersede_version"] for f in ("f0", "f1", "f2")} == {SUPERSEDE_VERSION}
    assert supersede_user(st, "dana")["examined"] == 0               # decided once


def _frag(fid: str, mid: str, day: int, content: str, vec: Any) -> dict[str, Any]:
    return {"id": fid, "subject": "Dana", "key": "", "content": content, "source_ids": [mid], "vector": vec,
            "valid_from": datetime(2024, 4, day, 9, tzinfo=timezone.utc).isoformat()}


def test_turns_without_fragments_keep_their_links_on_the_other_side(embedder: Embedder) -> None:
    """The newer turn has no fragment (extraction kept none): an update closes the older fragment
    holding the value with the newer turn's message row; a denial is kept on the older fragment."""
    texts = [("m1", 1, "My Zotero library has 45 sources tagged by theme and date."),
             ("m2", 2, "I submitted my cover letter to Greg for review on April 10 and I'm anxious about it."),
             ("m3", 5, "I've added more, so my Zotero library has 52 sources now, how should I organize them?"),
             ("m4", 6, "I've never submitted my cover letter to Greg for review, should I ask him to look at it?")]
    vecs = embedder.embed([t for _, _, t in texts])
    rows = [{**_turn(m, d, t, v), "id": f"msg-{m}"} for (m, d, t), v in zip(texts, vecs)]
    turns = Turns(rows + [_turn("a1", 3, "You have 45 sources, great work on the library.", vecs[0], "assistant")],
                  skip=["assistant"])
    assert [m["message_id"] for m in turns.rows] == ["m1", "m2", "m3", "m4"]    # assistants' turns skipped
    frags = [_frag("f1", "m1", 1, "Dana's Zotero library has 45 sources tagged by theme and date", vecs[0]),
             _frag("f2", "m2", 2, "Dana submitted her cover letter to Greg for review on April 10", vecs[1])]
    changed = stage_plan_turns(frags, ["m3", "m4"], turns)
    assert set(changed) == {"f1", "f2"}
    assert frags[0]["superseded_by"] == "msg-m3" and frags[0]["valid_until"].startswith("2024-04-05")
    assert frags[1]["contradicts_sources"] == ["m4"] and frags[1].get("superseded_by") is None
    stage_plan_turns(frags, ["m3", "m4"], turns)                            # again: links not doubled
    assert frags[1]["contradicts_sources"] == ["m4"] and frags[0]["superseded_by"] == "msg-m3"


def test_a_turn_that_denies_what_it_states(embedder: Embedder) -> None:
    text = ("I've never attempted any triangle classification problems before, but I recently completed 15 "
            "triangle classification problems with a consistent accuracy above 80%.")
    vec = embedder.embed([text])[0]
    turns = Turns([{**_turn("m1", 1, text, vec), "id": "msg-m1"}])
    frags = [_frag("f1", "m1", 1, "Dana has never attempted any triangle classification problems before", vec)]
    stage_plan_turns(frags, ["m1"], turns)
    assert frags[0]["contradicts_sources"] == ["m1"]
    plain = [_frag("f2", "m2", 1, "Dana completed 15 triangle classification problems", vec)]
    ok = "I recently completed 15 triangle classification problems with a consistent accuracy above 80%."
    stage_plan_turns(plain, ["m2"], Turns([{**_turn("m2", 1, ok, vec), "id": "msg-m2"}]))
    assert not plain[0].get("contradicts_sources")


def test_a_change_no_fragment_holds_gets_a_change_fragment(embedder: Embedder) -> None:
    """Each turn states its value (or its denial) inside a question, so extraction kept no fragment
    of either: the update and the denial are collected as unheld and become change fragments of the
    newer turns, naming the older turns in `replaces_sources` / `contradicts_sources`; built again,
    they have the same ids (a rerun adds no duplicate)."""
    texts = [("m1", 1, "I have a Zoom meeting with Professor Danielle on March 22 at 3 PM, what should I ask her?"),
             ("m2", 2, "Can you remind me that the Zoom meeting with Professor Danielle is rescheduled to "
                       "March 22 at 4:30 PM?"),
             ("m3", 3, "How do I use the advice I got from Bryan at the film festival in my personal statement?"),
             ("m4", 4, "I've never met Bryan at any film festival and never got advice from him, can you help me "
                       "say so in my personal statement?")]
    vecs = embedder.embed([t for _, _, t in texts])
    rows = [{**_turn(m, d, t, v), "id": f"msg-{m}"} for (m, d, t), v in zip(texts, vecs)]
    unheld: list[tuple[str, str, str, str]] = []
    assert stage_plan_turns([], ["m2", "m4"], Turns(rows), unheld=unheld) == {}
    assert sorted((new, old, field) for new, _, old, field in unheld) == [
        ("m2", "m1", "replaces_sources"), ("m4", "m3", "contradicts_sources")]
    session = SessionWork(user_id="dana", session_id="s2", ts=rows[1]["ts"], messages=rows[1:])
    made = {f["source_ids"][0]: f for f in change_fragments(unheld, [session], embedder, "r1")}
    assert set(made) == {"m2", "m4"}
    moved, denial = made["m2"], made["m4"]
    assert moved["replaces_sources"] == ["m1"] and "4:30 PM" in moved["content"]
    assert denial["contradicts_sources"] == ["m3"] and "replaces_sources" not in denial
    assert moved["user_id"] == "dana" and moved["supersede_version"] == SUPERSEDE_VERSION
    assert moved["vector"].shape == (embedder.dim,)
    again = change_fragments(unheld, [session], embedder, "r1")
    assert sorted(f["id"] for f in again) == sorted(f["id"] for f in made.values())
    assert change_fragments(unheld, [], embedder, "r1") == []            # a stored session's turn: none here


def test_prose_with_parentheses_hashes_and_arrows_is_a_statement() -> None:
    """Code blocks never reach the rule (`memory.text.prose`); a sentence keeps its parentheses,
    "C#", a plural "(s)" and a trailing tag, while unfenced code (a call, a comparison with a
    number, an error line, a code keyword), markup, quotes, headings and list labels stay out."""
    from memory.llm.rules.supersede import is_statement

    for prose in ("I raised my monthly marketing budget to $500 (from $400) this week",
                  "I rewrote the whole payment service in C# over the weekend",
                  "I need to email my friend(s) about the trip to Lisbon in June",
                  "I moved the launch of my bakery website to May 3 ->-> 2,7"):
        assert is_statement({"content": prose}), prose
    for code in ("const total = items.reduce((a, b) => a + b, 0);", "await fetch(url, options).then(r => r.json())",
                 "# Step 2: configure the database connection", "1. Open the settings page of the app",
                 "| Metric | Before | After | Change |", "**Event A**: getting heads on the first toss",
                 "<div class='card'>my profile picture goes here</div>", "Use the `--force` flag when you deploy it",
                 "SELECT name FROM users WHERE age > 30 ORDER BY name",
                 "if x > 0 and y < 10: return x + y else None",
                 "TypeError: Cannot read properties of undefined (reading 'map') at line 12",
                 "Traceback (most recent call last): File app.py, line 40, in main",
                 "def add (a, b): return a + b  # adds the two numbers",
                 "> You said the deadline for the report moves to May 3"):
        assert not is_statement({"content": code}), code
    older = _f("I built the backend of my budgeting app in Java with Spring Boot", "m1")
    newer = _f("I switched the backend of my budgeting app to C# (ASP.NET Core) instead", "m2")
    assert decide(newer, older, 0.7) == "update"
