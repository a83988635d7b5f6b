"""rules-supersede-v10 (the audit of v8's closings, its further changes): only reschedule cues move a
date or a time, and a past event's date is history; identifiers (status codes, ports, a version
after a product name) are no quantities; a number in a help request or a worked example is no
statement of the user's, in its clause only; a cue inside a hyphenated name is none, a year before a
name is a year; one table of unit spellings ("300 milliseconds" is "300ms"). Each case here was
decided otherwise by v9."""
from __future__ import annotations

from memory.llm.rules.supersede import SUPERSEDE_VERSION, decide, quantities
from tests.helpers import statement

_f = statement


def test_version() -> None:
    assert SUPERSEDE_VERSION == "rules-supersede-v13"


def test_only_a_reschedule_cue_moves_a_date() -> None:
    """Progress words (reached, switched, recently, new articles) say something happened on a
    date, not that a date moved; a reschedule cue reaches only the first value after it."""
    switched = _f("user is trying to organize user's essay draft better, so user switched from Microsoft Word to "
                  "Scrivener on May 5, and user is wondering if this will really improve user's draft organization",
                  "m1")
    reached = _f("user is trying to understand how user can improve user's essay writing, especially since user's "
                 "final draft reached 4,700 words by May 13, which is more than user initially targeted", "m2")
    assert decide(reached, switched, 0.6) is None
    session = _f("user has got a rescheduled writing session with Greg on April 7 after missing the April 5 one "
                 "due to an unexpected meeting", "m3")
    meeting = _f("user has got a meeting with Greg rescheduled from 3 PM to 5 PM on June 2 due to a production "
                 "deadline", "m4")
    assert decide(meeting, session, 0.6) is None             # the time moved, not the date
    # real reschedules still are
    due = _f("user has a deadline of April 1, 2024, for the first sprint of user's portfolio website", "m5")
    new = _f("user is trying to update user's project timeline to reflect the new sprint deadline of April 5, 2024, "
             "for user's portfolio website", "m6")
    assert decide(new, due, 0.6) == "update"
    launch = _f("user's book launch event for the novel is planned for November 15 at the library", "m7")
    moved = _f("user's book launch event for the novel has been rescheduled to November 22 at the library", "m8")
    assert decide(moved, launch, 0.6) == "update"


def test_a_past_events_date_is_history() -> None:
    """"used the Hemingway Editor on July 15" is a past event: an extended deadline replaces no date of it."""
    used = _f("user is trying to reduce passive voice in user's conference paper, and user used the Hemingway "
              "Editor on July 15, which showed user reduced it by 35%", "m1")
    extended = _f("The conference paper editing has been extended through July 19 to incorporate late feedback, "
                  "and user is wondering how this affects user's conference paper", "m2")
    assert decide(extended, used, 0.7) is None
    planned = _f("user is planning to use the editing time from July 16-18 for user's conference paper", "m3")
    assert decide(extended, planned, 0.7) == "update"        # a plan's date moves


def test_identifiers_are_no_quantities() -> None:
    assert quantities("user is getting intermittent 502 Bad Gateway errors and 500 errors on port 5000") == []
    assert [q.value for q in quantities("user is using PostgreSQL 14 with 12,500 restaurant entries")] == [12500.0]
    bad = _f("user is trying to troubleshoot an issue with user's Flask app where user is getting intermittent "
             "502 Bad Gateway errors", "m1")
    pool = _f("user is experiencing issues with connection pool exhaustion in user's Flask app, which is causing "
              "500 errors in user's Flask app", "m2")
    assert decide(pool, bad, 0.7) is None
    webcam = _f("user is trying to capture webcam input at 640x480 resolution with OpenCV on port 0 for the REST API "
                "of user's application", "m3")
    docker = _f("user has updated the Dockerfile of user's application to expose port 5000 for the REST API", "m4")
    assert decide(docker, webcam, 0.7) is None
    # a measure after a name is still a quantity
    assert [q.unit for q in quantities("user's GPU memory is now at 3GB")] == ["gb"]


def test_a_number_in_a_help_request_is_no_statement() -> None:
    """The clause of a request or an example holds an exercise's numbers, not the user's facts;
    a fact in another clause of the same statement still counts."""
    area = _f("user is trying to calculate the area of a triangle with a base of 10 inches and a height of 6 "
              "inches using Heron's formula", "m1")
    again = _f("can you help user calculate the area of a triangle with a base of 12 inches and a height of 6 "
               "inches using Heron's formula", "m2")
    assert decide(again, area, 0.8) is None
    done = _f("user is working on a triangle geometry project, and user has completed 10 triangle area problems "
              "with Heron's formula", "m5")
    more = _f("user is working on a triangle geometry project and user need help, user has completed 12 triangle "
              "area problems with Heron's formula", "m6")
    assert decide(more, done, 0.8) == "update"               # the request's clause ends before the fact
    example = _f("For instance, let's say user has two bounding boxes with confidence thresholds of 0.5", "m3")
    assert all(q.example for q in quantities(example["content"]))
    puzzle = _f("user is trying to understand how user's progress in solving complex probability puzzles has "
                "improved, given that user's average problem-solving time reduced from 20 to 12 minutes", "m4")
    faster = _f("user is trying to solve a complex probability puzzle and user need help, user has recently "
                "shortened user's average problem-solving time to 10 minutes", "m5")
    assert decide(faster, puzzle, 0.7) == "update"
    assert not any(q.example for q in quantities(faster["content"]))


def test_code_defects_of_v9() -> None:
    """A cue inside a hyphenated name is none; a year before a name is a year."""
    assert not any(q.cued for q in quantities("user added Flask-JWT-Extended 4 weeks ago to the dashboard login"))
    assert quantities("user is focusing on 1990-2020 Montserrat cinema for user's essay") == []


def test_one_table_of_unit_spellings() -> None:
    """"300 milliseconds", "300 msec" and "300ms" are one unit, here and in `modality`."""
    assert {q.unit for q in quantities("the API responds in 300 milliseconds, the cache in 4 msec, the DB in 9ms")} \
        == {"ms"}
    old = _f("user's login API response time is 350ms on the staging server", "m1")
    new = _f("user's login API response time is now 280 milliseconds on the staging server", "m2")
    assert decide(new, old, 0.8) == "update"
    bound = quantities("user wants the login API response time under 300 milliseconds")
    assert [(q.bound, q.condition) for q in bound] == [(True, False)]


def test_who_denies_decides_between_progress_and_contradiction() -> None:
    """A newer denial of what an older statement says is a contradiction, unless it is scoped to a
    time the statement does not share; an older "not yet" that a newer statement fulfils, or an
    older "never" that a newer statement says happened lately, is an update (v9 flagged both as
    contradictions, and the stale "not yet" ranked first)."""
    not_yet = _f("user has not yet booked the flights to Lisbon for the conference", "m1")
    booked = _f("user booked the flights to Lisbon for the conference this morning", "m2")
    assert decide(booked, not_yet, 0.8) == "update"
    never_had = _f("user has never had a pet dog at home with the family", "m3")
    adopted = _f("user finally had a pet dog at home with the family after the move", "m4")
    assert decide(adopted, never_had, 0.8) == "update"
    went = _f("user has been to Japan with the family twice and loved Kyoto", "m5")
    never = _f("user has never been to Japan with the family", "m6")
    assert decide(never, went, 0.8) == "contradiction"        # newer denial: ask the user
    assert decide(went, never, 0.8) == "contradiction"        # older denial, nothing says lately
    ran = _f("user ran the Boston marathon race in April 2018 with a friend", "m7")
    not_2023 = _f("user never ran the Boston marathon race in 2023 because of a knee injury", "m8")
    assert decide(not_2023, ran, 0.8) is None                 # two years, two facts
    not_2018 = _f("user never ran the Boston marathon race in 2018, it was someone else", "m9")
    assert decide(not_2018, ran, 0.8) == "contradiction"      # the same year: a real conflict


def test_a_dollar_amount_or_a_grouped_number_is_no_year() -> None:
    """$1900-$2100 and 1,900-2,100 are amounts; a bare 2019 stays a year."""
    assert [(q.value, q.unit) for q in quantities("user's monthly rent is now $2000")] == [(2000.0, "$")]
    assert [q.value for q in quantities("user's monthly rent is now 2,000 dollars")] == [2000.0]
    assert not quantities("user moved to the flat on Elm Street in 2019")
    rent = _f("user pays a monthly rent of $1800 for the apartment on Elm Street", "m1")
    raised = _f("user's monthly rent for the apartment on Elm Street is now $2000", "m2")
    assert decide(raised, rent, 0.8) == "update"


def test_a_plan_fulfils_no_denial() -> None:
    never = _f("user has never actually deployed an application to AWS before", "m1")
    plan = _f("Now, user is planning to deploy the app on AWS with monitoring and logging", "m2")
    assert decide(plan, never, 0.8) is None
