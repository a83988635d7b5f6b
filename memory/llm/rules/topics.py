"""The `topics` and `topic-merge` rules: RMM prospective reflection (Tan et al. §5, Appendix D.1), extractively."""
from __future__ import annotations

from typing import Any

from memory.llm.rules.registry import rule
from memory.llm.rules.statements import personal_statements, vocative_forms
from memory.segments import breakpoints
from memory.text import split_sentences, third_person

__all__ = ["topic_segments", "topics_answer", "topic_merge_answer"]

_TOPIC_MIN_TURNS = 3          # no segment shorter than this many turns
_TOPIC_MAX_TURNS = 10         # longer segments are split again at their weakest link
_TOPIC_DEPTH = 0.5            # a breakpoint is a link this many std below the session's mean similarity
_TOPIC_MAX_WORDS = 60
#: a summary stays within the D.1.1 answer schema's `maxLength` even when a statement is one huge
#: unpunctuated sentence (long assistant messages): its words are cut, never the schema broken
_TOPIC_MAX_CHARS = 2000


def topic_segments(sims: list[float], n: int) -> list[tuple[int, int]]:
    """[start, end) turn ranges of n turns cut at embedding breakpoints (`memory.segments`): links
    between consecutive turns whose cosine is well below the session's mean, deepest first, keeping
    segments >= _TOPIC_MIN_TURNS; segments over _TOPIC_MAX_TURNS are cut again at their weakest link."""
    if n == 0:
        return []
    if len(sims) != n - 1 or not sims:
        return [(0, n)]
    mean = sum(sims) / len(sims)
    std = (sum((x - mean) ** 2 for x in sims) / len(sims)) ** 0.5
    return breakpoints(sims, mean - _TOPIC_DEPTH * std, _TOPIC_MIN_TURNS, _TOPIC_MAX_TURNS)


@rule("topics")
def topics_answer(ctx: dict[str, Any]) -> dict[str, Any]:
    """RMM D.1.1 for one participant: the session cut into topics at embedding breakpoints
    (`adjacent_sims`); per topic, the participant's personal statements in it, third person,
    referencing the turns they came from. No statement in a segment -> no topic (NO_TRAIT)."""
    turns = ctx.get("turns", [])
    subject = str(ctx.get("subject") or "")
    vocatives = vocative_forms(list(ctx.get("participants") or []))
    out = []
    for a, b in topic_segments([float(x) for x in ctx.get("adjacent_sims", [])], len(turns)):
        values: list[str] = []
        refs: list[int] = []
        words = 0
        for t in turns[a:b]:
            if str(t.get("speaker") or "") != subject:
                continue
            for sentence in personal_statements(str(t.get("text") or ""), vocatives):
                value = _within(third_person(sentence, subject), _TOPIC_MAX_CHARS - 1)
                n = len(value.split())
                if words and words + n > _TOPIC_MAX_WORDS:
                    break
                if value.lower() in (v.lower() for v in values):
                    continue
                values.append(value.rstrip(".!") + ".")
                words += n
                if t["turn"] not in refs:
                    refs.append(int(t["turn"]))
        if values:
            out.append({"summary": _within(" ".join(values), _TOPIC_MAX_CHARS), "reference": refs})
    return {"extracted_memories": out}


def _within(text: str, limit: int) -> str:
    """`text` itself when it fits in `limit` characters, else its longest whole-word prefix that does."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    return cut[: cut.rfind(" ")] if " " in cut else cut


def _merge_text(old: str, new: str) -> str:
    """Extractive merge: the old summary's sentences plus the new ones it lacks, the oldest dropped
    first beyond _TOPIC_MAX_WORDS * 2 words."""
    sents = [s.strip() for s in split_sentences(old) if s.strip()]
    have = {s.lower() for s in sents}
    sents += [s.strip() for s in split_sentences(new) if s.strip() and s.strip().lower() not in have]
    while len(sents) > 1 and sum(len(s.split()) for s in sents) > 2 * _TOPIC_MAX_WORDS:
        sents.pop(0)
    return " ".join(sents)


@rule("topic-merge")
def topic_merge_answer(ctx: dict[str, Any]) -> dict[str, Any]:
    """RMM D.1.2: Merge into the most similar history topic when its cosine (given in the context)
    reaches the threshold, else Add()."""
    hist = ctx.get("history", [])
    if not hist:
        return {"action": "Add()"}
    best = max(range(len(hist)), key=lambda i: (float(hist[i].get("similarity", 0.0)), -i))
    if float(hist[best].get("similarity", 0.0)) < float(ctx.get("threshold", 0.75)):
        return {"action": "Add()"}
    merged = _within(_merge_text(hist[best]["summary"], ctx["new_summary"]), _TOPIC_MAX_CHARS)
    return {"action": f"Merge({best}, {merged})"}
