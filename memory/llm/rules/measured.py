"""What a number is about, for the `rules` supersede decision (rules-supersede-v11, v12).

Two numbers of one unit whose contexts share words are often about two different things: an
audit of v10's closings on the BEAM development stores found most wrong ones there ("a 400ms delay"
of the user's modal popup closed by "a 300ms delay" of the user's portfolio site; a quiz score by an
accuracy). The context words (`memory.llm.rules.supersede`) stay what makes two numbers one quantity;
these read what a number names and veto a change between two numbers that name different things
(`apart`), only when neither statement names the other's thing anywhere (a paraphrase such as
"input lag" / "input latency", or "memory footprint" / "memory usage", keeps a shared word):

* **the measure** the number is attached to (`measure`): the word right after it (``a 300ms
  debounce``, ``a 35% increase``), or the noun it completes (``an API response time of 280ms``,
  ``the ping interval to 25 seconds``, what recurs at it: ``health checks every 10 seconds``): a
  debounce is no response time, a data sync every 30 minutes no posting script every 5. The
  commonest paraphrases of one measure are kin, never apart (`KIN`: a latency, a lag, a delay, a
  time; a usage, a footprint);
* **the owner**, the speaker's possessive phrase nearest before it in its sentence (`owner`:
  ``user's modal popup``, ``my Docker container``): the thing the number is of;
* **the names** right before it (`names_before`: ``my close friend Dawn, who's 59`` / ``my close
  friend Diana, who's 60``): two named things, two facts.

A number that ends a whole change told in one statement (``improved from 78% to 88%``: `cues.whole_change`)
is compared with another whole change only when their contexts share twice `MIN_SHARED` words or
one starts where the other ended (``from 65 to 72`` / ``from 72 to 78``): each is the account of its
own change (a quiz score's, an accuracy's), and most such pairs in a chat are two tests, two runs
(`memory.llm.rules.supersede._apart`).

v12 (an audit of v11's wrong closings, most still two numbers of two things):

* owners are compared by their **head** noun too (`owner_head`): "user's Twitter API integration" /
  "user's Twitter API query" share words but name two things; the head is read past opening
  adjectives ("user's new message edit feature") and a possessive inside the phrase ends it ("user's
  Flask app's memory usage": the app's). Two heads are apart unless one is the other's short form
  ("app" / "application") or a statement names the other's (`heads_apart`);
* one measure of two **kinds** (`kind`, `kinds_apart`): the word before the measure noun a number
  completes ("average parsing time to 650ms" / "API response time is 320ms", "frame processing
  latency from 250ms" / "API latency of 150ms").
"""
from __future__ import annotations

import re
from typing import AbstractSet

from memory.llm.rules.units import unit_of
from memory.text import is_content

__all__ = ["KIN", "apart", "heads_apart", "kin", "kind", "kinds_apart", "measure", "owner", "owner_head",
           "names_before", "stem", "words"]

_STEM_RE = re.compile(r"(?:ing|ed|es|s)$")
_WORD_RE = re.compile(r"[A-Za-z][\w\-]*(?:\.[A-Za-z]\w*)*")
#: words that join a number to what it measures, or end a phrase: never a measure or an owner
_FUNCTION = frozenset("""and but or with for to of in on at by as is was are were be been the a an which that this
these those than then from into per each every after before during over under when while so because if
it its user users my your our their his her i we you own new current latest first last""".split())
#: approximations between a measure noun and its number ("a response time of about 280ms")
_APPROX = r"(?:(?:about|around|roughly|approximately|nearly|almost|just|only|over|under|~)\s+)?"
#: the noun a number completes: "response time of 280ms", "timeout to 5 seconds", "coverage is at 90%",
#: what recurs at an interval ("health checks every 10 seconds", "data sync every 30 minutes")
_COMPLETES_RE = re.compile(r"([A-Za-z][\w\-]*)\s+(?:of|is|was|at|to|every|reached|hit|stands\s+at|sits\s+at|"
                           r"(?:is|was)\s+(?:now|currently)(?:\s+at)?|(?:is|was)\s+at)\s+"
                           + _APPROX + r"[$~]?$", re.IGNORECASE)
_AFTER_RE = re.compile(r"^\s*([A-Za-z][\w\-]*)")
#: the word naming which kind of a measure the number completes: "parsing time to 650ms", "API latency
#: of 150ms", "frame processing latency from 250ms" (v12)
_KIND_RE = re.compile(r"([A-Za-z][\w\-@]*)\s+[A-Za-z][\w\-]*\s+(?:of|is|was|at|to|from|reached|hit|(?:is|was)\s+"
                      r"(?:now|currently)(?:\s+at)?)\s+" + _APPROX + r"[$~]?$", re.IGNORECASE)
_SENTENCE_RE = re.compile(r"[.;:!?]\s")
#: a comma right before a clause's subject ("my progress, I've completed 40%"): an owner before it is
#: another clause's (not after a relative or a conjunction: "user's modal popup, which currently has a
#: 400ms delay", "user's portfolio site, and user has identified a 300ms delay")
_SUBJECT_CLAUSE_RE = re.compile(r",\s*(?:I|I'm|I've|I'd|we|we've|user|he|she|they)(?![\w'])", re.IGNORECASE)
#: capitalized words that are no names (dates, times, the first person)
_NOT_NAMES = frozenset("""i january february march april may june july august september october november december
jan feb mar apr jun jul aug sep sept oct nov dec monday tuesday wednesday thursday friday saturday sunday
am pm""".split())
#: adjectives opening an owner's phrase, read past to its nouns (v12: "user's new message edit feature")
_ADJECTIVES = frozenset("new current latest own first main".split())
#: measures that are one under other names (stemmed): how long something takes, how much memory it holds
KIN: dict[str, str] = {**{w: "duration" for w in ("latency", "lag", "delay", "time", "duration")},
                       **{w: "usage" for w in ("usage", "footprint", "consumption")}}
#: words of the sentence before a number where a name is read (`names_before`)
NAME_WORDS = 6
#: words of the speaker's possessive phrase read as its owner (`owner`)
OWNER_WORDS = 3



def stem(word: str) -> str:
    """A word without its inflection ("commits" -> "commit"), words of four letters or fewer kept."""
    return _STEM_RE.sub("", word) if len(word) > 4 else word


def words(text: str) -> frozenset[str]:
    """Every word of `text`, lower-cased and stemmed: what a statement names anywhere."""
    return frozenset(stem(w.lower()) for w in _WORD_RE.findall(text))


def _noun(word: str) -> str:
    """A content word that can name a measure ("time", a stopword elsewhere, is one: "a response time
    of 280ms"), stemmed, or ""."""
    low = word.lower()
    if low in _FUNCTION or not (is_content(low) or low == "time") or low.endswith("ing"):
        return ""
    return stem(low)


def measure(prefix: str, rest: str) -> frozenset[str]:
    """The word a number is attached to: the one right after it and its unit (`rest`: "a 300ms
    debounce"), or the noun it completes at the end of `prefix` ("a response time of 280ms")."""
    out = set()
    after = _AFTER_RE.match(rest)
    if after and (noun := _noun(after.group(1))):
        out.add(noun)
    completes = _COMPLETES_RE.search(prefix)
    if completes and not completes.group(1).lower().endswith("ed") and (noun := _noun(completes.group(1))):
        out.add(noun)
    return frozenset(out)


def _after_possessive(prefix: str, speaker: AbstractSet[str]) -> list[str] | None:
    """The lower-cased words after the speaker's possessive nearest before the number in its sentence
    and clause (`owner`, `owner_head`), or None when there is none."""
    sentence = _SUBJECT_CLAUSE_RE.split(_SENTENCE_RE.split(prefix)[-1].replace("\u2019", "'"))[-1]
    raw = [t.lower() for t in re.findall(r"[A-Za-z][\w'.\-]*", sentence)]
    possessives = {w for w in speaker if w.endswith("'s")} | {"my", "our"}
    at = max((i for i, t in enumerate(raw) if t in possessives), default=-1)
    return raw[at + 1:] if at >= 0 else None


def owner(prefix: str, speaker: AbstractSet[str], reach: int) -> frozenset[str]:
    """The content words of the speaker's possessive phrase nearest before the number in its
    sentence and clause ("user's modal popup", "my Docker container"; not "my progress" of "my
    progress, I've completed 40% of the draft"), when at most `reach` content words
    (the number's context window) follow the possessive ("user's modal popup, which currently has
    a 400ms delay"; a possessive further back is another clause's: "user's application, considering
    the recent growth of commits merged into the main branch, which has now reached 165");
    `speaker`: the subject's possessives ("user's"), "my" and "our" always."""
    rest = _after_possessive(prefix, speaker)
    if rest is None:
        return frozenset()
    tokens = [t.removesuffix("'s").strip("'.") for t in rest]       # "app's" -> "app"
    if sum(1 for t in tokens if t not in _FUNCTION and is_content(t)) > reach:
        return frozenset()
    out = set()
    for t in tokens[:OWNER_WORDS]:
        if t in _FUNCTION:
            break
        if is_content(t):
            out.add(stem(t))
    return frozenset(out)


def kind(prefix: str) -> str:
    """The word before the measure noun that a number completes, naming which kind it is ("average
    parsing time of 650ms": parsing; "API response time is 320ms": response), or "" (v12)."""
    found = _KIND_RE.search(prefix)
    word = found.group(1).lower() if found else ""
    return stem(word) if word and word not in _FUNCTION and is_content(word) else ""


def owner_head(prefix: str, speaker: AbstractSet[str], reach: int) -> str:
    """The head of the owner (`owner`): the last noun of the speaker's possessive phrase (up to one
    noun past `OWNER_WORDS`: "user's real-time object detection app"), read past
    its opening adjectives ("user's new message edit feature": feature) and ending at a possessive
    inside it ("user's Flask app's memory usage": the memory is the Flask app's), or "" (v12)."""
    rest = _after_possessive(prefix, speaker)
    if rest is None or sum(1 for t in rest if t.strip("'.") not in _FUNCTION and is_content(t.removesuffix("'s"))) > reach:
        return ""
    head, nouns = "", 0
    for t in rest:
        word = t.removesuffix("'s").strip("'.")
        if word in _ADJECTIVES and not nouns:
            continue                                   # "user's new message edit feature"
        if word in _FUNCTION or not is_content(word) or nouns == OWNER_WORDS + 1:
            break
        head, nouns = word, nouns + 1
        if t.endswith("'s"):
            break                                      # "user's Flask app's memory": the app's
    return stem(head)


def heads_apart(a: str, b: str, a_words: frozenset[str], b_words: frozenset[str]) -> bool:
    """Two owners' heads (`owner_head`) name two things: they differ, neither is the other's short
    form ("app" / "application"), and neither statement names the other's anywhere (v12)."""
    return bool(a) and bool(b) and not (a.startswith(b) or b.startswith(a)) and a not in b_words \
        and b not in a_words


def kinds_apart(a: frozenset[str], b: frozenset[str], a_kind: str, b_kind: str, a_words: frozenset[str],
                b_words: frozenset[str]) -> bool:
    """One measure (`a`, `b`: equal or `kin`) of two kinds (`kind`: "parsing time" / "API response
    time"), neither statement naming the other's kind (v12)."""
    return kin(a, b) and heads_apart(a_kind, b_kind, a_words, b_words)


def names_before(prefix: str) -> frozenset[str]:
    """Capitalized names among the `NAME_WORDS` words before a number in its sentence, not the
    word opening it (dates, times and "I" are no names)."""
    sentence = _SENTENCE_RE.split(prefix)[-1]
    tokens = _WORD_RE.findall(sentence)
    out = set()
    for i, t in enumerate(tokens):
        if i < len(tokens) - NAME_WORDS or i == 0 or not t[0].isupper() or t.lower() in _NOT_NAMES \
                or unit_of(t):
            continue                                   # a unit ("from 300MB to 180MB") is no name
        out.add(stem(t.lower()))
    return frozenset(out)


def apart(a: frozenset[str], b: frozenset[str], a_words: frozenset[str], b_words: frozenset[str]) -> bool:
    """Two numbers name different things: each names one (`a`, `b`: their measures, owners or
    names), they share none, and neither statement (`a_words`, `b_words`: its `words`) names the
    other's anywhere."""
    return bool(a) and bool(b) and not a & b and not a & b_words and not b & a_words


def kin(a: frozenset[str], b: frozenset[str]) -> bool:
    """Two measures name one thing under other names (`KIN`: "input lag" / "input latency")."""
    return any(KIN.get(x, x) == KIN.get(y, y) for x in a for y in b)
