"""rules-supersede-v12 (an audit of v11's wrong closings on the BEAM development stores): the head of
an owner, amounts added and spreads, values said as former, counted nouns, hyphenated units, what a
a measurement's window, a goal said as an infinitive, and two
readings of the named-value rule. Each case here was decided "update" by v11 (invented sentences);
the right updates next to them still are."""
from __future__ import annotations

from memory.llm.rules.cues import former
from memory.llm.rules.measured import heads_apart, kind, measure, owner_head
from memory.llm.rules.modality import added, mode, spread, window
from memory.llm.rules.named import denied_names, named_change, next_step
from memory.llm.rules.supersede import SUPERSEDE_VERSION, decide, quantities
from tests.helpers import statement

_f = statement


def test_version() -> None:
    assert SUPERSEDE_VERSION == "rules-supersede-v13"


def test_owners_with_other_heads_are_two_things() -> None:
    """"my bakery website's checkout page" / "my bakery website's search index": owners sharing words
    but not their head noun are two things."""
    page = _f("I am tuning my garden shop inventory page, which currently loads in about 900ms on a phone", "m1")
    index = _f("I am tuning my garden shop inventory index, which now answers in about 120ms on a phone", "m2")
    assert decide(index, page, 0.8) is None
    again = _f("I am tuning my garden shop inventory page, which now loads in about 600ms on a phone", "m3")
    assert decide(again, page, 0.8) == "update"
    assert owner_head("I am tuning my new garden shop inventory page, which loads in ", {"user's"}, 6) == "page"
    assert owner_head("user is tuning user's Rails app's memory usage, which is ", {"user's"}, 6) == "app"
    assert not heads_apart("app", "application", frozenset(), frozenset())


def test_an_added_amount_is_a_delta() -> None:
    """"the thumbnail step adds about 200ms" is no total time; "a 40ms overhead" neither."""
    total = _f("I am profiling the photo upload flow of the gallery, and the total upload time is now 1,400ms", "m1")
    step = _f("I am profiling the photo upload flow of the gallery, and the thumbnail step adds about 200ms", "m2")
    assert decide(step, total, 0.8) is None
    overhead = _f("I am profiling the photo upload flow of the gallery to cut the 40ms overhead of resizing", "m3")
    assert decide(overhead, total, 0.8) is None
    assert added("the thumbnail step adds about ", " to it") and added("to cut the ", " overhead of")
    assert added("booked an extra ", " for the seat") and not added("the total is ", " now")


def test_a_spread_is_no_value() -> None:
    """"a jitter of ±30ms" bounds the values around a mean; it changes no mean."""
    mean = _f("I am measuring the render loop of my drawing app, and the average frame time is now 18ms", "m1")
    jitter = _f("I am measuring the render loop of my drawing app, and reduced the frame time jitter to ±6ms", "m2")
    assert decide(jitter, mean, 0.8) is None
    assert spread("the jitter went from ±") and mode("a jitter of ±", " on", "ms").bound


def test_a_former_value_is_history() -> None:
    """"my original estimate of 40 hours" and the "from" of a change told whole held before: a later
    value replaces neither."""
    plan = _f("I finished the garden shed in June, well over my original estimate of 40 hours of carpentry work",
              "m1")
    quote = _f("I am planning a second garden shed, and the carpenter quoted 48 hours of carpentry work for it", "m2")
    assert decide(quote, plan, 0.8) is None
    assert former("well over my original estimate of ", "40 hours") and former("improved from ", "85% to 93%")
    assert not former("improved from 85% to ", "93%")
    assert [q.former for q in quantities("the test pass rate rose from 85% to 93%")] == [True, False]


def test_a_count_reads_past_its_adjective() -> None:
    """"4 new chapters" counts chapters, not something the context names ("9 beta testers")."""
    chapters = _f("my writing group sent feedback from the beta testers, like the 4 new chapters they proposed", "m1")
    testers = _f("my writing group now wants to collect the feedback from 9 beta testers before the launch", "m2")
    assert decide(testers, chapters, 0.8) is None
    assert [q.unit for q in quantities("they proposed 4 new chapters")] == ["chapter"]


def test_a_hyphenated_unit_names_what_it_measures() -> None:
    """"a 3,000-word short story" is a count of words of a story, no weekly word target."""
    story = _f("I have set a goal to finish a 3,000-word short story draft by June 2, and I feel the pressure", "m1")
    weekly = _f("I am trying to meet my writing goals with a weekly target of 1,500 words until the draft is done",
                "m2")
    assert decide(weekly, story, 0.8) is None
    found = quantities("finish a 3,000-word short story")
    assert [(q.value, q.unit) for q in found] == [(3000.0, "word")] and found[0].measure == frozenset({"short"})


def test_a_window_of_time_is_a_condition() -> None:
    """"over a 30-day trial" is the window a count covers: it changes no retention period."""
    assert window("sign-ups over a ", "day") and window("errors in the first ", "hour")
    assert not window("I practise for ", "hour")
    logs = _f("I keep the server logs of my shop with a retention period of 14 days on the cloud", "m1")
    trial = _f("I saw the sign-up rate of my shop over a 30-day trial period, and it is now at 4%", "m2")
    assert decide(trial, logs, 0.8) is None


def test_a_goal_said_as_an_infinitive_is_a_bound() -> None:
    """"I set a goal to finish 12 chapters" is an aim, not a count a result replaces."""
    assert mode("I set a goal to run ", " km by May", "km").bound
    goal = _f("I set a goal to finish 12 chapters of my cookbook by the summer holidays this year", "m1")
    done = _f("I have now finished 9 chapters of my cookbook, ahead of the summer holidays this year", "m2")
    assert decide(done, goal, 0.8) is None


def test_now_opening_a_next_step_replaces_nothing() -> None:
    """"now I need to handle Stripe webhooks" says what comes next, not what replaced PayPal."""
    assert next_step(" I need to handle") and next_step(" user has to migrate") and not next_step(" uses Kong")
    assert not next_step(" I can use FastAPI") and not next_step(" I have to use Kubernetes")   # a state
    old = _f("I am building the checkout of my shop with PayPal buttons and a JSON order summary for buyers", "m1")
    new = _f("I am building the checkout of my shop, and now I need to handle Stripe webhooks for buyers", "m2")
    assert not named_change(new, old, 0.9)
    moved = _f("I am building the checkout of my shop, and it now uses Stripe instead for buyers", "m3")
    assert named_change(moved, old, 0.9)


def test_a_denied_name_is_no_value() -> None:
    """A name the older statement says was never used ("never tried Nginx") is no value a newer
    "switched to Caddy" replaces."""
    assert denied_names("I have never deployed the blog or tried Nginx for it, so I ask") == {"Nginx"}
    assert denied_names("I built the queue without Redis") == {"Redis"}
    # a denial of something else: the name is held
    assert not denied_names("I couldn't be happier hosting my portfolio on Vercel with a custom domain")
    assert not denied_names("I haven't had any outages since I moved the shop app to PostgreSQL")
    assert not denied_names("I do not regret choosing PostgreSQL for the shop app database")
    held = _f("I do not regret choosing PostgreSQL for the shop app database", "m5")
    assert named_change(_f("I do not regret it: I now use MySQL for the shop app database", "m6"), held, 0.9)
    old = _f("I am hardening the login of my blog, and I have never deployed it or tried Nginx in production", "m1")
    new = _f("I am hardening the login of my blog, since I am switching to Argon hashing for the passwords", "m2")
    assert not named_change(new, old, 0.9)
    used = _f("I am hardening the login of my blog, which runs on Nginx in production", "m3")
    assert named_change(_f("I am hardening the login of my blog, which now runs on Caddy in production", "m4"),
                        used, 0.9)


def test_one_measure_of_two_kinds_is_two_things() -> None:
    """"the average rendering time" and "the average network response time" are both times, of two kinds."""
    assert kind("I have cut the average rendering time to ") == "render"
    assert kind("the average network response time is ") == "response"
    render = _f("I am speeding up the photo gallery, and I have cut the average rendering time to 420ms on phones",
                "m1")
    network = _f("I am speeding up the photo gallery, and the average network response time is now 180ms on phones",
                 "m2")
    assert decide(network, render, 0.8) is None
    faster = _f("I am speeding up the photo gallery, and I have now cut the average rendering time to 300ms on "
                "phones", "m3")
    assert decide(faster, render, 0.8) == "update"
