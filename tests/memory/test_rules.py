"""The `rules` backend and PREMem date normalization: deterministic stand-ins for the LLM steps."""
from __future__ import annotations

import json
import re
from datetime import datetime

import jsonschema
import pytest

from memory import prompts
from memory.dates import find_time_expression, normalize_date, time_match
from memory.llm.base import LLMRequest, backend_factory
from memory.llm.rules import RulesBackend, TASKS
from memory.text import categorize, key_phrase, prose, third_person
from tests.helpers import LOCOMO

MSG_DAY = datetime(2023, 5, 8, 13, 56)        # a Monday


# -- dates ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, category, expected", [
    ("I went to a LGBTQ support group yesterday.", "experiential", "2023-05-07"),
    ("I ran a charity race last Saturday.", "experiential", "2023-05-06"),
    ("I painted that lake two days ago.", "experiential", "2023-05-06"),
    ("I met her a couple of days ago.", None, "2023-05-06"),
    ("I saw the show last week.", "experiential", "2023-05-01"),
    ("I quit my job last month.", "experiential", "2023-04-08"),
    ("Last weekend we went hiking.", "experiential", "2023-05-06"),
    ("We're thinking about going camping next month.", "subjective", "After 2023-05-08"),
    ("I want to learn Spanish.", "subjective", "After 2023-05-08"),
    ("I'm going to a concert tomorrow.", "subjective", "2023-05-09"),
    ("I will see her next Friday.", None, "2023-05-12"),
    ("I am leaving in 3 days.", None, "2023-05-11"),
    ("I went to Paris.", "experiential", "Before 2023-05-08"),
    ("I went to Paris.", None, "Before 2023-05-08"),
    ("I live in Rome.", "factual", "2023-05-08"),
    ("I live in Rome.", None, "2023-05-08"),
    ("I love spicy food.", "subjective", "2023-05-08"),
    ("I got married on 3 May 2023.", "experiential", "2023-05-03"),
    ("I was born on the 5th of June, 1990.", None, "1990-06-05"),
    ("I moved here in 2022.", "experiential", "2022-01-01"),
    ("I started pottery in March.", "experiential", "2023-03-01"),
    ("I adopted him 3 years ago.", "experiential", "2020-05-08"),
    ("I had a great dinner with friends today.", "experiential", "2023-05-08"),
])
def test_normalize_date(text, category, expected):
    assert normalize_date(text, MSG_DAY, category) == expected


def test_normalize_date_accepts_iso_strings_and_dates():
    assert normalize_date("I went there yesterday", "2023-05-08T13:56:00") == "2023-05-07"
    assert normalize_date("I went there yesterday", MSG_DAY.date()) == "2023-05-07"
    assert normalize_date("I went there yesterday", "2023-05-08T13:56:00+02:00") == "2023-05-07"


def test_dates_match_the_prompt_pattern():
    pattern = re.compile(prompts.DATE_PATTERN)
    for text in ("yesterday I ran", "I will go", "I went", "I am", "back in 2019 I started",
                 "next year I want to", "on Saturday I played"):
        assert pattern.match(normalize_date(text, MSG_DAY))


def test_find_time_expression():
    assert find_time_expression("I ran a race last Saturday, it was fun") == "last Saturday"
    assert find_time_expression("We moved in 2022") == "in 2022"
    assert find_time_expression("I went there two days ago") == "two days ago"
    assert find_time_expression("I may go, May says") is None      # "may" the verb is no month
    assert find_time_expression("I live in Rome") is None
    assert time_match("see you tomorrow")[0] == "future"
    assert time_match("next month maybe")[0] == "vague_future"


# -- extraction helpers -----------------------------------------------------------------------------
@pytest.mark.parametrize("sentence, category", [
    ("I went to a support group yesterday and it was so powerful", "experiential"),
    ("I visited my grandma in Ohio", "experiential"),
    ("I've been to Japan twice", "experiential"),
    ("Last week I had a chat with a fan", "experiential"),
    ("Melanie ran a charity race for mental health", "experiential"),
    ("I love spicy food", "subjective"),
    ("I usually wake up at 7 AM", "subjective"),
    ("My goal is to learn Spanish", "subjective"),
    ("I'm going to visit Europe next year", "subjective"),
    ("I think that movie was great", "subjective"),
    ("I live in New York", "factual"),
    ("I have a Bachelor's degree in CS", "factual"),
    ("Emily is my sister", "factual"),
    ("I work as a nurse", "factual"),
])
def test_categorize(sentence, category):
    assert categorize(sentence) == category


@pytest.mark.parametrize("sentence, expected", [
    ("I love my dog", "Ann loves Ann's dog"),
    ("I'm living in Rome now", "Ann is living in Rome now"),
    ("I've tried sushi", "Ann has tried sushi"),
    ("I'll call my mom", "Ann will call Ann's mom"),
    ("I'd love to go", "Ann would love to go"),
    ("I'd never been there", "Ann had never been there"),
    ("I have a cat and it likes me", "Ann has a cat and it likes Ann"),
    ("I don't like it", "Ann doesn't like it"),
    ("I usually go hiking", "Ann usually goes hiking"),
    ("I took my kids to a park", "Ann took Ann's kids to a park"),
    ("That bike is mine", "That bike is Ann's"),
    ("I did it myself", "Ann did it themself"),
    ("My teammates and I were thrilled", "Ann's teammates and Ann were thrilled"),
    ("I carved out some me-time", "Ann carved out some me-time"),
])
def test_third_person(sentence, expected):
    assert third_person(sentence, "Ann") == expected


def test_key_phrase():
    assert key_phrase("I went to a LGBTQ support group yesterday and it was so powerful") == "LGBTQ support group"
    assert key_phrase("I ran a charity race for mental health last Saturday") == "charity race"
    for s in ("I love spicy food", "My brother Junho lives in Seattle", "I quit my job at Coupang in March",
              "It is what it is", "I am"):
        k = key_phrase(s)
        assert k and 1 <= len(k.split()) <= 4, (s, k)
    assert key_phrase("My brother Junho lives in Seattle") == key_phrase("My brother Junho lives in Seattle")


# -- the backend ------------------------------------------------------------------------------------
def _session(messages, sid="s1"):
    return {"user_id": "u1", "session_id": sid, "participants": sorted({m[1] for m in messages}),
            "messages": [{"message_id": mid, "speaker": spk, "text": text, "ts": ts}
                         for mid, spk, text, ts in messages]}


SESSION = _session([
    ("m1", "Alex", "Hey Hana! How have you been?", "2024-05-17T10:00:00"),
    ("m2", "Hana", "Hi Alex! Good to see you!", "2024-05-17T10:01:00"),
    ("m3", "Alex", "Wow, I'm living in Rome now with my girlfriend. I ate chicken with my friends yesterday.",
     "2024-05-17T10:02:00"),
    ("m4", "Hana", "That's great, Alex! I love spicy food and I want to visit Japan next year.",
     "2024-05-17T10:03:00"),
    ("m5", "Alex", "Thanks! I quit my job at Coupang. What about you?", "2024-05-17T10:04:00"),
    ("m6", "Hana", "I totally agree.", "2024-05-17T10:05:00"),
])


def _extract(session):
    req = prompts.extract_request(session)
    [resp] = RulesBackend().complete([req])
    assert resp.error is None and resp.text is not None
    answer = json.loads(resp.text)
    jsonschema.validate(answer, req.schema)
    jsonschema.validate(answer, prompts.EXTRACT_SCHEMA)
    return answer


def test_backend_registered_and_named():
    assert backend_factory("rules") is RulesBackend
    b = RulesBackend()
    assert (b.name, b.live, b.model) == ("rules", False, "rules-v1")
    assert {"extract", "reason"} <= set(TASKS)


def test_extract_answer():
    answer = _extract(SESSION)
    items = [(cat, it) for cat, lst in answer.items() for it in lst]
    by_value = {it["value"]: (cat, it) for cat, it in items}
    assert all(it["message_id"] in {"m3", "m4", "m5"} for _, it in items)   # no greetings, no questions
    cat, it = by_value["Alex is living in Rome now with Alex's girlfriend"]
    assert cat == "Factual_Information" and it["subject"] == "Alex" and it["date"] == "2024-05-17"
    cat, it = by_value["Alex ate chicken with Alex's friends yesterday"]
    assert cat == "Experiential_Information" and it["date"] == "2024-05-16" and it["message_id"] == "m3"
    cat, it = by_value["Hana loves spicy food and Hana wants to visit Japan next year"]
    assert cat == "Subjective_Information" and it["subject"] == "Hana" and it["date"] == "After 2024-05-17"
    cat, it = by_value["Alex quit Alex's job at Coupang"]
    assert cat == "Experiential_Information" and it["date"] == "Before 2024-05-17"
    assert "Coupang" in it["key"]
    parsed = prompts.parse_extraction(answer, {m["message_id"] for m in SESSION["messages"]})
    assert len(parsed) == len(items)


def test_parsing_drops_items_of_whitespace_or_impossible_dates() -> None:
    """What the schema lets by but means nothing: a subject, key or value of whitespace only (minLength
    counts it), a day no calendar has (the date pattern checks digits only), a blank insight."""
    good = {"subject": "Ann", "key": "pet", "value": "Ann has a cat", "message_id": "m1", "date": "2024-02-29"}
    answer = {"Factual_Information": [good, {**good, "subject": " "}, {**good, "value": "\n"},
                                      {**good, "date": "2024-02-30"}, {**good, "date": "Before 2023-13-01"}],
              "Experiential_Information": [{**good, "key": "\t", "date": "After 2024-03-01"}],
              "Subjective_Information": []}
    assert [(f["content"], f["date"]) for f in prompts.parse_extraction(answer, {"m1"})] == \
        [("Ann has a cat", "2024-02-29")]
    insights = prompts.parse_reasoning({"extended_insight": [
        {"inference_type": "connection", "key": "pets", "date": "2024", "value": "Ann likes cats"},
        {"inference_type": "connection", "key": " ", "date": "2024", "value": "blank key"},
        {"inference_type": "connection", "key": "pets", "date": "2024", "value": "  "}]})
    assert [i["content"] for i in insights] == ["Ann likes cats"]


def test_extract_empty_and_odd_sessions():
    assert _extract(_session([])) == {"Factual_Information": [], "Experiential_Information": [],
                                      "Subjective_Information": []}
    odd = _session([("m1", "Bo", "", "2024-01-01T00:00:00"), ("m2", "Bo", "ok?", "2024-01-01"),
                    ("m3", "Bo", "I adopted a cat named Luna", "2024-01-01")])
    answer = _extract(odd)
    assert [it["message_id"] for lst in answer.values() for it in lst] == ["m3"]


def test_code_blocks_are_not_statements():
    """Pasted code is not something the user says about themselves: no fragment comes from a fenced
    or indented code block, while the prose around it still makes fragments."""
    text = ("I'm building a Flask app for my expense tracker.\n```python\nfrom flask import Flask, request\n"
            "# Implement user login for my app\nId = db.Column(db.Integer, primary_key=True)\n```\n"
            "My deadline is April 3 and I want to finish the login page first.\n\n"
            "    # Initialize Bootstrap components for my page\n\nThat's the code I have.")
    answer = _extract(_session([("m1", "user", text, "2024-01-01T00:00:00")]))
    values = [it["value"] for lst in answer.values() for it in lst]
    assert any("expense tracker" in v for v in values) and any("April 3" in v for v in values)
    assert not any(w in v for v in values for w in ("import", "Implement user login", "Column", "Bootstrap"))
    assert prose("no code here\n  indented two spaces") == "no code here\n  indented two spaces"
    assert prose("a\n```\nunclosed fence\nto the end") == "a"
    # line breaks the parser does not count (\u2028, \x0b, \x0c) stay inside a line; \r\n and \r are \n
    assert prose("I moved.\u2028I run.\x0bI swim.\n```\nx = 1\n```\nI live in Oslo.") == \
        "I moved.\u2028I run.\x0bI swim.\nI live in Oslo."
    assert prose("a\r\n```\r\ncode\r\n```\rb") == "a\nb"
    assert prose("    I indent my messages.\n\n    x = compute(1)\n\nDone.").split() == "I indent my messages. Done.".split()
    every = "    I moved to Berlin.\n\n    I love cats.\n\n    My wife is Ann."      # indentation every line shares
    assert prose(every).split() == "I moved to Berlin. I love cats. My wife is Ann.".split()
    long = "I moved to Berlin.\n```\nx = 1\n```\n" + "I run every day. " * 2000        # not cached, same answer
    assert prose(long) == long.replace("```\nx = 1\n```\n", "").strip()


def test_unknown_task_is_an_error():
    req = LLMRequest(task="summarize-xyz", prompt_version="v", messages=[], schema={}, context={})
    [resp] = RulesBackend().complete([req])
    assert resp.text is None and resp.error == "rules backend has no rule for task summarize-xyz"
    assert resp.error_kind == "fatal"       # every request of that task would fail the same way


def test_a_bad_context_is_quarantined_not_retried():
    """The rules are deterministic: a request they fail on is rejected (quarantined), not transient."""
    from memory.llm.runner import LLMRunner

    good = prompts.extract_request(SESSION)
    broken = LLMRequest(task=good.task, prompt_version=good.prompt_version, messages=good.messages,
                        schema=good.schema, context={"messages": 5})
    [resp] = RulesBackend().complete([broken])
    assert resp.error_kind == "rejected" and resp.error.startswith("rules backend failed on task")
    answers, bad = LLMRunner(RulesBackend()).run([broken, good])
    assert answers[0] is None and answers[1] == _extract(SESSION)
    assert len(bad) == 1 and bad[0].request is broken and "rules backend failed" in bad[0].reason


def test_batch_keeps_order_and_is_deterministic():
    reqs = [prompts.extract_request(SESSION), prompts.reason_request(PAIR_ACCUM),
            prompts.extract_request(_session([("x", "Bo", "I live in Oslo with my dog", "2024-02-02")]))]
    a = [r.text for r in RulesBackend().complete(reqs)]
    b = [r.text for r in RulesBackend().complete(list(reversed(reqs)))]
    assert a == list(reversed(b))
    assert json.loads(a[0]) == _extract(SESSION)
    assert "Oslo" in a[2] and "extended_insight" in a[1]


# -- reasoning --------------------------------------------------------------------------------------
def _frag(fid, subject, category, key, content, date):
    return {"id": fid, "subject": subject, "category": category, "key": key, "content": content,
            "date": date, "source_ids": [f"msg-{fid}"]}


PAIR_ACCUM = {"user_id": "u1", "link_id": "l1",
              "earlier": [_frag("1", "Melanie", "experiential", "charity race",
                                "Melanie ran a charity race for mental health", "2023-05-20")],
              "later": [_frag("2", "Melanie", "experiential", "charity race",
                              "Melanie signed up for another charity race", "2023-06-09"),
                        _frag("3", "Melanie", "experiential", "charity run",
                              "Melanie ran a charity race with her kids", "Before 2023-06-10")]}
PAIR_FLIP = {"user_id": "u1", "link_id": "l2",
             "earlier": [_frag("1", "Jon", "subjective", "pottery", "Jon loves pottery classes", "2023-01-10")],
             "later": [_frag("2", "Jon", "subjective", "pottery", "Jon hates pottery now and quit the class",
                             "2023-03-01")]}
PAIR_CHANGE = {"user_id": "u1", "link_id": "l3",
               "earlier": [_frag("1", "Jon", "factual", "job", "Jon works as a banker", "2023-01-01")],
               "later": [_frag("2", "Jon", "factual", "job", "Jon now runs a dance studio", "2023-03-01")]}
PAIR_CONNECT = {"user_id": "u1", "link_id": "l4",
                "earlier": [_frag("1", "Caroline", "experiential", "support group",
                                  "Caroline went to an LGBTQ support group", "2023-05-07")],
                "later": [_frag("2", "Caroline", "factual", "adoption agency",
                                "Caroline chose an adoption agency that helps LGBTQ folks", "2023-05-25")]}
PAIR_EXTEND = {"user_id": "u1", "link_id": "l5",
               "earlier": [_frag("1", "Jon", "experiential", "hiking trip", "Jon went hiking in the Alps",
                                 "Before 2023-01-01")],
               "later": [_frag("2", "Jon", "subjective", "hiking", "Jon loves hiking in the mountains",
                               "2023-03-01")]}
PAIR_NOTHING = {"user_id": "u1", "link_id": "l6",
                "earlier": [_frag("1", "Ann", "factual", "pet cat", "Ann has a cat", "2023-01-01")],
                "later": [_frag("2", "Ann", "experiential", "tax return", "Ann filed taxes", "2023-04-01"),
                          _frag("3", "Bo", "factual", "pet cat", "Bo has a cat", "2023-04-01")]}


def _reason(pair):
    req = prompts.reason_request(pair)
    [resp] = RulesBackend().complete([req])
    assert resp.error is None
    answer = json.loads(resp.text)
    jsonschema.validate(answer, prompts.REASON_SCHEMA)
    insights = answer["extended_insight"]
    assert len(insights) <= 3
    for it in insights:
        assert len(it["value"].split()) <= 20 and len(it["date"]) <= 64
    assert prompts.parse_reasoning(answer) is not None
    return insights


def test_reason_accumulation():
    [ins] = [i for i in _reason(PAIR_ACCUM) if i["inference_type"] == "accumulation"]
    assert ins["key"] == "charity race (recurring)"
    assert ins["value"] == "Melanie repeatedly mentions charity race (3 times)"
    assert ins["date"] == "2023-05-20 to Before 2023-06-10"


def test_reason_transformation_sentiment_flip_and_state_change():
    [ins] = [i for i in _reason(PAIR_FLIP) if i["inference_type"] == "transformation"]
    assert ins["value"].startswith("Jon changed from loves pottery classes to hates pottery")
    assert ins["date"] == "2023-01-10 to 2023-03-01"
    [ins] = [i for i in _reason(PAIR_CHANGE) if i["inference_type"] == "transformation"]
    assert ins["value"] == "Jon changed from works as a banker to now runs a dance studio"


def test_reason_connection_and_extension():
    [ins] = [i for i in _reason(PAIR_CONNECT) if i["inference_type"] == "connection"]
    assert "LGBTQ" in ins["value"] and ins["value"].startswith("Caroline links support group and adoption agency")
    [ins] = [i for i in _reason(PAIR_EXTEND) if i["inference_type"] == "extension"]
    assert "hiking" in ins["value"] and ins["date"] == "Before 2023-01-01 to 2023-03-01"


def test_reason_returns_nothing_when_nothing_applies():
    assert _reason(PAIR_NOTHING) == []
    assert _reason({"user_id": "u1", "link_id": "x", "earlier": [], "later": []}) == []


def test_reason_is_deterministic():
    for pair in (PAIR_ACCUM, PAIR_FLIP, PAIR_CHANGE, PAIR_CONNECT, PAIR_EXTEND):
        req = prompts.reason_request(pair)
        assert RulesBackend().complete([req])[0].text == RulesBackend().complete([req])[0].text


# -- LoCoMo: validity of every answer ------------------------------------------------------------------
def _locomo_sessions():
    data = json.loads(LOCOMO.read_text())
    for sample in data:
        conv = sample["conversation"]
        for name, turns in conv.items():
            if not re.fullmatch(r"session_\d+", name) or not isinstance(turns, list):
                continue
            ts = datetime.strptime(conv[f"{name}_date_time"], "%I:%M %p on %d %B, %Y")
            yield _session([(t["dia_id"], t["speaker"], t["text"], ts.isoformat()) for t in turns],
                           sid=f"{sample['sample_id']}/{name}")


@pytest.mark.skipif(not LOCOMO.exists(), reason="LoCoMo dev data not present")
def test_locomo_extraction_validity() -> None:
    """Every rules answer over LoCoMo dev fits the schema, cites a message of its session, names that
    message's speaker, and the same requests give the same answers. (Speed: `mnemo bench consolidate`.)"""
    sessions = list(_locomo_sessions())
    requests = [prompts.extract_request(s) for s in sessions]
    responses = RulesBackend().complete(requests)
    n_messages = sum(len(s["messages"]) for s in sessions)
    total = 0
    for session, resp in zip(sessions, responses):
        answer = json.loads(resp.text)
        jsonschema.validate(answer, prompts.EXTRACT_SCHEMA)
        ids = {m["message_id"] for m in session["messages"]}
        speakers = {m["message_id"]: m["speaker"] for m in session["messages"]}
        for items in answer.values():
            for it in items:
                assert it["message_id"] in ids
                assert it["subject"] == speakers[it["message_id"]]
                total += 1
    assert n_messages == 2760 and total > 1000
    assert [r.text for r in RulesBackend().complete(requests[:5])] == [r.text for r in responses[:5]]
