"""rules-supersede-v11 (an audit of v10's closings: most wrong ones were two numbers of one unit about
different things): what a number is attached to, its owner and the names before it
(`memory.llm.rules.measured`), whole changes told in one statement, limits, loads and deltas. Each
case here was decided "update" by v10; the right updates next to them still are."""
from __future__ import annotations

from memory.llm.rules.cues import whole_change
from memory.llm.rules.measured import apart, measure, names_before, owner, words
from memory.llm.rules.modality import mode, speaks_of_limits
from memory.llm.rules.supersede import SUPERSEDE_VERSION, decide, quantities
from tests.helpers import statement

_f = statement


def test_version() -> None:
    assert SUPERSEDE_VERSION == "rules-supersede-v13"


def test_a_different_measure_is_another_fact() -> None:
    """A 300ms debounce is no API latency: the numbers' measures differ and neither statement
    names the other's."""
    debounce = _f("user is tuning the search box of user's recipe app, and user has set a 300ms debounce to "
                  "cut the number of API calls", "m1")
    response = _f("user is tuning the search box of user's recipe app, which now has an average API latency "
                  "of 280ms on most queries", "m2")
    assert decide(response, debounce, 0.7) is None
    # the same measure changed is still an update
    faster = _f("user is tuning the search box of user's recipe app, which now has an average API latency "
                "of 190ms after caching", "m3")
    assert decide(faster, response, 0.7) == "update"


def test_a_measure_named_in_the_other_statement_still_changes() -> None:
    """A paraphrase that names the other's measure somewhere is not vetoed ("lag" / "latency")."""
    lag = _f("user is trying to fix the input lag of the search field, whose latency is currently 500ms on "
             "slow phones", "m1")
    latency = _f("user has reduced the search field input latency, and the lag is now 320ms on slow phones", "m2")
    assert decide(latency, lag, 0.7) == "update"


def test_different_owners_are_two_facts() -> None:
    """"user's modal popup ... a 400ms delay" and "user's portfolio site ... a 300ms delay": two things
    of the user's, neither statement naming the other."""
    popup = _f("user is trying to speed up user's modal popup, which currently has a 400ms delay due to "
               "image loading", "m1")
    site = _f("user is trying to speed up user's portfolio site, which currently has a 300ms delay in "
              "initial rendering", "m2")
    assert decide(site, popup, 0.7) is None
    later = _f("user is trying to speed up user's modal popup, which now has a 150ms delay after lazy "
               "loading images", "m3")
    assert decide(later, popup, 0.7) == "update"


def test_an_owner_far_back_is_another_clauses() -> None:
    """A possessive more than a context window before the number owns nothing of it."""
    found = quantities("user is trying to secure user's application, considering the recent growth of commits "
                       "merged into the main branch, which has now reached 165")
    assert found and found[0].owner == frozenset()
    assert owner("user is trying to speed up user's modal popup, which currently has a ", {"user's"}, 6) == \
        frozenset({"modal", "popup"})
    assert owner("I'm kinda worried about my progress, I've completed ", set(), 6) == frozenset()
    assert owner("user is speeding up user's portfolio site, and user has identified a ", {"user's"}, 6) == \
        frozenset({"portfolio", "site"})


def test_an_owner_of_another_clause_vetoes_nothing() -> None:
    """"my progress, I've completed 40% of the first draft" names no owner of the 40%: the later
    "90% of the draft" of the personal statement updates it."""
    early = _f("I'm kinda worried about my progress, I've completed 40% of the first draft but I want to finish "
               "it by March 31", "m1")
    later = _f("user is worried about finishing user's personal statement on time, since user has already "
               "finished 90% of the draft", "m2")
    assert decide(later, early, 0.7) == "update"


def test_differently_named_things_are_two_facts() -> None:
    """Two friends' ages: "friend Dawn, who's 59" / "friend Diana, who's 60"."""
    dawn = _f("user is updating user's resume, and user's close friend Dawn, who's 59, recommended an action "
              "verb library", "m1")
    diana = _f("user is worried about user's resume update, since user's close friend Diana, who's 60, is "
               "updating hers too", "m2")
    assert decide(diana, dawn, 0.7) is None
    assert names_before("user's close friend Diana, who's ") == frozenset({"diana"})


def test_two_whole_changes_are_two_changes() -> None:
    """"quiz score improved from 78% to 88%" and "accuracy improved from 70% to 90%": each statement
    tells its own change whole; they are one only at a context of twice MIN_SHARED words."""
    accuracy = _f("user is trying to understand how the accuracy in area calculation problems improved from "
                  "70% to 90% after completing 12 problems", "m1")
    quiz = _f("user is trying to understand how the quiz score improved from 78% to 88% on special lines "
              "and area formulas", "m2")
    assert decide(quiz, accuracy, 0.7) is None
    cpu = _f("user has managed to reduce the average CPU usage of the posting job from 35% to 20% by trimming "
             "JSON payloads", "m3")
    again = _f("user has managed to reduce the average CPU usage of the posting job from 25% to 15% by "
               "optimizing JSON serialization", "m4")
    assert decide(again, cpu, 0.7) == "update"
    # a change that starts where the other ended is one chain
    first = _f("user has been tracking readability scores with Readable.com and improved from 65 to 72 "
               "Flesch-Kincaid score", "m5")
    then = _f("user is kinda worried about user's readability score, it improved from 72 to 78 Flesch-Kincaid "
              "between June and August", "m6")
    assert decide(then, first, 0.7) == "update"


def test_whole_change_reads_both_ends() -> None:
    text = "user's problem-solving time dropped from 20 to 12 minutes"
    at20, at12 = text.index("20"), text.index("12")
    assert whole_change(text[:at20], text[at20:]) and whole_change(text[:at12], text[at12:])
    plain = "user's problem-solving time is now 12 minutes"
    assert not whole_change(plain[:plain.index("12")], plain[plain.index("12"):])


def test_a_limit_and_a_measured_value_are_two_facts() -> None:
    """"using around 400MB" / "a memory limit set to 512MB"; a value whose statement speaks of a
    limit still changes a limit ("rate limiting ... set it to 100" / "the new rate limit of 120")."""
    usage = _f("user is trying to optimize the memory usage of user's Docker container, which is currently "
               "using around 400MB of memory", "m1")
    limit = _f("user is trying to optimize the memory usage of user's Docker container, which has a memory "
               "limit set to 512MB to prevent resource exhaustion", "m2")
    assert decide(limit, usage, 0.7) is None
    rate = _f("user is implementing API rate limiting with Flask-Limiter to prevent abuse, and user has set it "
              "to 100 requests per minute", "m3")
    raised = _f("user is updating user's API to handle the new rate limit of 120 requests per minute for "
                "abuse prevention", "m4")
    assert decide(raised, rate, 0.7) == "update"
    assert mode("a memory limit set to ", " to prevent", "mb").limit
    assert mode("a max display time of ", ", which", "second").limit
    assert mode("with a ", " memory cap", "gb").limit
    assert not mode("the memory usage is capped at ", " during", "mb").limit
    assert speaks_of_limits("user is implementing API rate limiting") and not speaks_of_limits("using 400MB")


def test_a_load_is_a_condition() -> None:
    """"with 50 concurrent users" qualifies a measurement like "under 50 concurrent users": two
    measurements under other loads are two facts."""
    assert mode("load testing with ", " users", "concurrent").condition
    uptime = _f("user has been load testing user's API, and user achieved 99.9% uptime during 48-hour load "
                "testing with 50 concurrent users", "m1")
    target = _f("user has been load testing user's API to keep the average response time under 350ms during "
                "load tests with 30 concurrent users", "m2")
    assert decide(target, uptime, 0.7) is None
    # a bare load (a plan to simulate users) replaces no measurement's load, only another bare load
    measured = _f("user has currently got the socket latency at 120ms under 50 concurrent users, and user is not "
                  "sure that is acceptable", "m3")
    plan = _f("user wants to simulate 500 concurrent users to check the socket latency of the system", "m4")
    assert decide(plan, measured, 0.7) is None
    bigger = _f("user is now simulating 1,000 concurrent users to check the socket latency of the system", "m5")
    assert decide(bigger, plan, 0.7) == "update"


def test_a_delta_changes_no_delta() -> None:
    """Two amounts of change are two changes ("reduce passive voice by 25%" in an essay, "by 35%" in
    a paper)."""
    essay = _f("user used the Hemingway Editor on the essay to reduce passive voice by 25%, and user wonders "
               "if that is enough", "m1")
    paper = _f("user used the Hemingway Editor on the conference paper and reduced passive voice by 35%, and "
               "user wonders if that is enough", "m2")
    assert decide(paper, essay, 0.8) is None


def test_what_recurs_at_an_interval_is_its_measure() -> None:
    """"engagement data sync every 30 minutes" / "posting scripts every 5 minutes": two schedules."""
    sync = _f("user is setting up cron jobs for scheduling, and user has configured one to run the engagement "
              "data sync every 30 minutes on the server", "m1")
    posting = _f("user is having issues with user's cron jobs for scheduling, which are configured to run the "
                 "posting scripts every 5 minutes", "m2")
    assert decide(posting, sync, 0.7) is None
    again = _f("user has changed the cron jobs for scheduling to run the posting scripts every 10 minutes "
               "instead", "m3")
    assert decide(again, posting, 0.7) == "update"
    assert measure("run the posting scripts every ", " for delivery") == frozenset({"script"})


def test_kin_measures_are_never_apart() -> None:
    """A lag and a latency, a footprint and a usage: one measure under two names."""
    lag = _f("user is fixing the search field of user's recipe app, which has a 500ms lag on slow phones", "m1")
    latency = _f("user is fixing the search field of user's recipe app, which now has a latency of 320ms on slow "
                 "phones", "m2")
    assert decide(latency, lag, 0.7) == "update"


def test_a_unit_is_no_name() -> None:
    assert names_before("user reduced the peak memory from 300MB to ") == frozenset()
    assert names_before("user reduced the Redis memory from ") == frozenset({"redi"})


def test_measure_reads_the_word_after_and_the_noun_completed() -> None:
    assert measure("user has set a ", " debounce to cut calls") == frozenset({"debounce"})
    assert measure("an average API latency of ", " on most queries") == frozenset({"latency"})
    assert measure("user increased the ping interval to ", " as a fix") == frozenset({"interval"})
    assert measure("user is ", ", and then") == frozenset()
    assert apart(frozenset({"debounce"}), frozenset({"latency"}), words("a debounce"), words("an API latency"))
    assert not apart(frozenset({"lag"}), frozenset({"latency"}), words("lag"), words("input lag, latency"))
