"""Review RN18: a yearless date takes its nearest occurrence (the tense only breaks near-ties), the
sentence split keeps abbreviations, and "X and I" is a plural subject."""
from __future__ import annotations

import pytest

from memory.dates import normalize_date
from memory.text import split_sentences, third_person


@pytest.mark.parametrize("text, said, expected", [
    # a past verb naming the arranging of a later event: the date is the event's, ahead
    ("I booked the flights to Mexico City for July 10th", "2024-05-21", "2024-07-10"),
    ("I signed up for the Brooklyn Half Marathon on May 18th", "2024-03-05", "2024-05-18"),
    ("I bought tickets for the concert on January 5th", "2024-12-20", "2025-01-05"),
    # a progressive plan and a present state: the nearest month
    ("We are moving to Denver in March", "2024-02-10", "2024-03-01"),
    ("Lisbon in June is lovely", "2024-04-20", "2024-06-01"),
    # the tense breaks near-ties: a past verb keeps a month 116 days ahead in the past year
    ("I visited Japan in September", "2023-05-08", "2022-09-01"),
    ("I started pottery in March", "2023-05-08", "2023-03-01"),
    ("I went there in May", "2023-05-08", "2023-05-01"),          # the current month
    # a span that marks the past itself
    ("Back in March I was sad", "2023-02-10", "2022-03-01"),
    ("I have lived here since June", "2023-05-08", "2022-06-01"),
    # a year given, a plan with a month, and weekdays keep their rules
    ("I was born on the 5th of June, 1990", "2023-05-08", "1990-06-05"),
    ("I'm going to move to Denver in March", "2024-02-10", "After 2024-02-10"),
    ("I went hiking on Saturday", "2023-05-08", "2023-05-06"),
    ("I will go on Saturday", "2023-05-08", "2023-05-13"),
    # "last" after an article or a possessive is "final", no relative past ("her" may be an object)
    ("My last night shift at St. Mary's is on April 5th", "2024-03-30", "2024-04-05"),
    ("I saw her last week", "2024-03-30", "2024-03-23"),
])
def test_yearless_dates_take_the_nearest_occurrence(text, said, expected):
    assert normalize_date(text, said) == expected


@pytest.mark.parametrize("text, expected", [
    ("I work at St. Mary's. Dr. Smith is my boss.", ["I work at St. Mary's.", "Dr. Smith is my boss."]),
    ("My last night shift at St. Mary's is on April 5th.", ["My last night shift at St. Mary's is on April 5th."]),
    ("I met Mr. and Mrs. Jones. Prof. Lee came too.", ["I met Mr. and Mrs. Jones.", "Prof. Lee came too."]),
    ("I love J. K. Rowling. She writes well.", ["I love J. K. Rowling.", "She writes well."]),
    ("I met John F. Kennedy Jr. once. Wow.", ["I met John F. Kennedy Jr. once.", "Wow."]),
    # a lone capital after a lowercase word is a chord or a grade, no initial
    ("It uses A minor, G, C and F. We can work on it.", ["It uses A minor, G, C and F.", "We can work on it."]),
    ("I got an A. My mom was happy.", ["I got an A.", "My mom was happy."]),
    ("We watched Lakers vs. Celtics. Great game.", ["We watched Lakers vs. Celtics.", "Great game."]),
    ("I like fruit, e.g. Apples. Yes.", ["I like fruit, e.g. Apples.", "Yes."]),
    ("I moved to the U.S. last year. It was hard.", ["I moved to the U.S. last year.", "It was hard."]),
    ("I moved to the U.S. My parents stayed.", ["I moved to the U.S.", "My parents stayed."]),
    ("I pack books etc. for trips. I like pie etc. We bake.",
     ["I pack books etc. for trips.", "I like pie etc.", "We bake."]),
    ("I wake at 7 a.m. every day.\nDr.\nOk", ["I wake at 7 a.m. every day.", "Dr.", "Ok"]),
    ('"I said no." Then I left!', ['"I said no.', "Then I left!"]),
])
def test_split_sentences_keeps_abbreviations(text, expected):
    assert split_sentences(text) == expected


@pytest.mark.parametrize("sentence, expected", [
    ("Emma and I are planning a trip", "Emma and Ann are planning a trip"),
    ("My wife and I have two kids", "Ann's wife and Ann have two kids"),
    ("Emma and I've been friends for years", "Emma and Ann have been friends for years"),
    ("Last weekend, my best friend and I love it", "Last weekend, Ann's best friend and Ann love it"),
    ("When my sister and I go out, I have fun", "When Ann's sister and Ann go out, Ann has fun"),
    # "and I" opening a clause of its own: the verb is agreed
    ("I was tired and I go home", "Ann was tired and Ann goes home"),
    ("We cooked and I love it", "We cooked and Ann loves it"),
])
def test_third_person_plural_subject(sentence, expected):
    assert third_person(sentence, "Ann") == expected
