"""What rules-supersede-v5 adds (issue 12): a measurement under another condition is another fact,
not an update; a change verb reaches its value through "to" however long its object; and a newer
statement that gives back the value its older one replaced restates the old state instead of
replacing the current one (unless it says the value went back). Real embedder where vectors matter."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from memory.embed import Embedder
from memory.llm.rules.supersede import changed, decide, quantities, restates
from memory.llm.rules.turns import History, Turns
from memory.stages.supersede import plan
from tests.helpers import statement

_f = statement


def test_a_measurement_under_another_condition_is_another_fact() -> None:
    before = _f("user has been measuring the login API response time and it's currently at 180ms under 20 "
                "concurrent requests", "m1")
    after = _f("user's login API response time has decreased to 120ms under 20 concurrent requests after "
               "optimizing the authentication flow", "m2")
    other = _f("user has noticed that under 300 concurrent requests, user's login API response time is around "
               "210ms, which is acceptable", "m3")
    assert decide(after, before, 0.7) == "update"          # the same condition: the value changed
    assert decide(other, after, 0.7) is None               # another load: both measurements hold
    assert changed(other, after) == []
    plan_more = _f("user is now planning the login API capacity for 300 concurrent users", "m5")
    plan_less = _f("user is planning the login API capacity for 100 concurrent users", "m4")
    assert decide(plan_more, plan_less, 0.7) == "update"   # a condition alone that changes is a change


def test_only_under_and_across_mark_a_condition() -> None:
    """A second number after "with" or "for" is part of the update, not its condition; under another
    condition a measurement is another fact, whether it says it changed or keeps its value."""
    pairs = [("user now solves 12 problems a day with 90% accuracy in the geometry set",
              "user solves 15 problems a day with 95% accuracy in the geometry set"),
             ("user's wedding budget is now $30,000 with 150 guests at the lake venue",
              "user's wedding budget is $20,000 with 100 guests at the lake venue"),
             ("user now runs 8 km a day for 6 weeks of marathon training",
              "user runs 5 km a day for 3 weeks of marathon training")]
    for new, old in pairs:
        assert decide(_f(new, "m2"), _f(old, "m1"), 0.8) == "update", new
    before = _f("user's login API response time is 180ms under 20 concurrent requests", "m1")
    cued = _f("user's login API response time has dropped to 150ms under 300 concurrent requests", "m2")
    same = _f("user's login API response time is 180ms under 300 concurrent requests", "m3")
    assert decide(cued, before, 0.8) is None
    assert decide(same, before, 0.8) is None


def test_a_range_or_a_bound_is_no_change_cue() -> None:
    club = _f("user's movie club meets on Fridays from 7 to 9 PM at the old cinema downtown", "m2")
    older = _f("user's movie club meets on Fridays at 8 PM at the old cinema downtown", "m1")
    assert decide(club, older, 0.8) is None
    guests = _f("user set up the spare room for guests staying from May 2 to May 6 this spring", "m2")
    assert decide(guests, _f("user's guests are staying in the spare room until May 4 this spring", "m1"),
                  0.8) is None
    assert not any(q.cued for q in quantities("user joined a reading challenge of up to 40 books this year"))


def test_a_change_verb_reaches_its_value_through_to() -> None:
    first = _f("user needs to set a sprint deadline of April 1, 2024, to complete the Instagram automation "
               "prototype", "m1")
    moved = _f("user is trying to adjust the deadline for user's Instagram automation prototype to April 5, "
               "2024, as mentioned", "m2")
    assert decide(moved, first, 0.6) == "update"
    trip = _f("user is flying with the Instagram automation prototype demo to Lisbon on April 5, 2024", "m3")
    assert decide(trip, first, 0.6) is None                # no change verb: a date is not a new deadline
    far = _f("user adjusted the layout. user's Instagram automation prototype deadline talk goes to April 5, "
             "2024", "m4")
    assert decide(far, first, 0.6) is None                 # the verb is in another sentence


def test_giving_back_a_replaced_value_restates_it() -> None:
    first = _f("user is implementing API rate limiting using Flask-Limiter and has set it to 100 requests/minute",
               "m1")
    update = _f("user is trying to update user's API to handle the new rate limit of 120 requests per minute",
                "m2")
    again = _f("user has configured the limiter to allow 100 requests per minute, but user still gets errors", "m3")
    assert decide(again, update, 0.7) == "update"          # alone, the pair looks like a change...
    assert restates(again, update, [first])                # ...but it gives back what `update` replaced
    back = _f("user has set the rate limit back to 100 requests per minute after the load tests", "m4")
    assert not restates(back, update, [first])             # saying so makes it a real change
    assert not restates(_f("user has raised the limiter to allow 150 requests per minute for the API", "m5"),
                        update, [first])


def test_a_revert_said_at_the_number_is_a_change() -> None:
    first = _f("user set the API rate limit to 100 requests per minute for the public endpoints", "m1")
    raised = _f("user has raised the API rate limit to 120 requests per minute for the public endpoints", "m2")
    for said in ("user has lowered the API rate limit to 100 requests per minute for the public endpoints",
                 "user's API rate limit is now 100 requests per minute for the public endpoints"):
        assert not restates(_f(said, "m3"), raised, [first]), said
    rerun = _f("user ran the load test again and the API rate limit of 100 requests per minute still fails", "m4")
    assert restates(rerun, raised, [first])                # "again" is no revert


def _frag(fid: str, mid: str, day: int, content: str, vec: Any) -> dict[str, Any]:
    return {"id": fid, "subject": "user", "key": "", "content": content, "source_ids": [mid], "vector": vec,
            "valid_from": datetime(2024, 4, day, 9, tzinfo=timezone.utc).isoformat()}


def _turn(mid: str, day: int, text: str, vec: Any) -> dict[str, Any]:
    return {"id": f"msg-{mid}", "message_id": mid, "speaker": "user", "text": text, "vector": vec,
            "ts": datetime(2024, 4, day, 9, tzinfo=timezone.utc)}


def test_a_restatement_leaves_the_current_value_current(embedder: Embedder) -> None:
    """Through `plan`: the second value closes the first; a later restatement of the first closes
    nothing (the second stays current); a later "back to" closes the second."""
    texts = ["user is implementing API rate limiting using Flask-Limiter and has set it to 100 requests/minute",
             "user is trying to update user's API to handle the new rate limit of 120 requests per minute",
             "user has configured the Flask-Limiter limiter to allow 100 requests per minute for the API"]
    vecs = embedder.embed(texts)
    frags = [_frag(f"f{i}", f"m{i}", i + 1, t, v) for i, (t, v) in enumerate(zip(texts, vecs))]
    plan(frags, ["f0", "f1", "f2"], {})
    assert frags[0]["superseded_by"] == "f1"
    assert not frags[1].get("superseded_by")
    back = "user has moved the Flask-Limiter rate limit back to 100 requests per minute for the API"
    frags.append(_frag("f3", "m3", 9, back, embedder.embed([back])[0]))
    plan(frags, ["f3"], {})
    assert frags[1]["superseded_by"] == "f3"


def test_a_restatement_does_not_replace_a_turn(embedder: Embedder) -> None:
    """Turn against turn: the older turn's fragment replaced an even older turn's value (its
    `replaces_sources`); a newer statement restating that value does not replace the older turn."""
    texts = [("m1", 1, "I'm implementing API rate limiting using Flask-Limiter and I've set it to 100 "
                       "requests/minute."),
             ("m2", 2, "I'm trying to update my API to handle the new rate limit of 120 requests per minute.")]
    vecs = embedder.embed([t for _, _, t in texts])
    turns = Turns([_turn(m, d, t, v) for (m, d, t), v in zip(texts, vecs)])
    holder = {**_frag("f2", "m2", 2, "user is trying to fix a Flask error in user's API", vecs[1]),
              "replaces_sources": ["m1"]}
    said = "user has configured the limiter to allow 100 requests per minute for the API"
    new = _f(said, "m9")
    vec = embedder.embed([said])[0]
    assert turns.replaced(new, vec, "2024-04-10T00:00:00+00:00") == ["m2"]     # no history: an update
    history = History([holder], turns)
    assert turns.replaced(new, vec, "2024-04-10T00:00:00+00:00", history) == []


def test_a_restatement_of_a_replaced_turn_in_the_same_run(embedder: Embedder) -> None:
    """The older fragment replaced a turn no fragment holds, and both fragments are decided in one
    run: the newer one is judged in the older one's turn, before its turn link is made, and the
    history still holds the turn it replaces."""
    texts = [("m0", 1, "I've set the rate limit to 100 requests/minute in Flask-Limiter for my API."),
             ("m1", 2, "I'm trying to update my API to handle the new rate limit of 120 requests per minute."),
             ("m2", 3, "I've configured the limiter to allow 100 requests per minute for the API.")]
    vecs = embedder.embed([t for _, _, t in texts])
    turns = Turns([_turn(m, d, t, v) for (m, d, t), v in zip(texts, vecs)])
    frags = [_frag("f1", "m1", 2, "user is trying to update user's API to handle the new rate limit of 120 "
                   "requests per minute", vecs[1]),
             _frag("f2", "m2", 3, "user has configured the limiter to allow 100 requests per minute for the API",
                   vecs[2])]
    plan(frags, ["f1", "f2"], {}, turns=turns)
    assert frags[0]["replaces_sources"] == ["m0"]
    assert not frags[0].get("superseded_by")


def test_a_number_without_a_cue_changes_only_a_close_statement() -> None:
    """v9 (an audit of v8: 130 of 390 closings were two quantities of one unit): an uncued number
    updates only at a cosine of at least `QUANTITY_SIM`, and a span of time's unit word ("seconds")
    is no shared context word unless the newer value says it changed."""
    heartbeat = _f("user's server-side heartbeat timeout was set to 60 seconds", "m1")
    driver = _f("user set the MongoDB driver connection timeout to 10 seconds", "m2")
    assert decide(driver, heartbeat, 0.35) is None and decide(driver, heartbeat, 0.6) is None
    staging = _f("My API latency is 60ms on the staging server", "m1")
    measured = _f("My API latency was 45ms in the last load test", "m2")
    assert decide(measured, staging, 0.4) is None                   # uncued and far
    assert decide(measured, staging, 0.7) == "update"               # uncued and close
    assert decide(_f("My API latency is now 45ms after the caching change", "m2"), staging, 0.4) == "update"
    assert decide(_f("user has extended the probability study sessions to 4 hours a week", "m2"),
                  _f("user spends 3 hours a week on probability study sessions", "m1"), 0.6) == "update"


def test_a_target_a_delta_and_a_condition_are_other_facts() -> None:
    """v9 (42 of v8's 390 closings were a target closed by a measurement or the reverse): a target or
    bound changes only a target, a delta only a delta, a condition only a condition; conditions that
    change while both statements measure something are two facts, whatever the units."""
    target = _f("user wants to ensure the API response time of the login endpoint is under 300ms", "m1")
    assert [q.bound for q in quantities(target["content"])] == [True]
    assert decide(_f("user improved the API response time of the login endpoint to 220ms", "m2"), target, 0.8) is None
    assert decide(_f("user got 92% test coverage for the auth module after adding tests", "m2"),
                  _f("user is aiming for an 85% test coverage target for the auth module", "m1"), 0.8) is None
    assert decide(_f("user's worker memory usage has stabilized at 160MB in production", "m2"),
                  _f("user reduced the worker memory usage in production by 12MB", "m1"), 0.8) is None
    # a target that changes, a measurement that changes, a raise "up to" a level: updates
    assert decide(_f("user's test coverage target for the auth module is now 90%", "m2"),
                  _f("user's test coverage target for the auth module is 85%", "m1"), 0.8) == "update"
    assert decide(_f("user's login endpoint API response time has dropped to 180ms", "m2"),
                  _f("user's login endpoint API response time is 220ms", "m1"), 0.8) == "update"
    assert decide(_f("user's tests brought the payment module coverage up to 96%", "m2"),
                  _f("user's payment module coverage is at 94% with the current tests", "m1"), 0.8) == "update"
    latency = _f("Dana's round-trip latency improved to 95ms under 50 concurrent users on the chat server", "m1", "Dana")
    assert decide(_f("Dana is simulating 1,000 concurrent users on the login API with Artillery", "m2", "Dana"),
                  _f("Dana's login API response time is 120ms under 50 concurrent users", "m1", "Dana"), 0.8) is None
    assert decide(_f("Dana's peak heap usage reached 220MB under 200 concurrent users on the chat server", "m2",
                     "Dana"), latency, 0.8) is None
