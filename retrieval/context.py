"""Prompt-ready memory context (PREMem §3.3): the retrieved items arranged chronologically, each with
its date, kind and key, within a token budget.

Tokens are approximated without a tokenizer as ceil(words × 1.3) (English BPE averages about 1.3
tokens per word), plus a token per character of a script written without spaces (Chinese, Japanese,
Thai...) and per 4 characters of a word over 12 (a URL, a hash), which would otherwise count as one
word and overrun the budget many times; the budget is filled in rank order (the best items survive a tight budget),
then the chosen items are printed oldest first so the model reads the history as it happened.

Validity (retrieval.validity): a current memory that replaced older ones reads "X, current since
DATE (before: Y)", a superseded one "(no longer current since DATE)" (and, when it replaced older
ones itself, "X, from DATE (before: Y)": never "current"), a turn holding a replaced value, or a
memory restating one, "(updated [DATE]: Z)" (its current version), and a contradiction is flagged
"CONTRADICTS [DATE] Y; also [DATE] Z: ask the user which holds", so the answering model can ask.
"""
from __future__ import annotations

import math
import re
from typing import Any, Iterable, Protocol

from memory.read import PROFILE_KEY

TOKENS_PER_WORD = 1.3
#: a word longer than this counts a token more per `CHARS_PER_TOKEN` characters beyond it
LONG_WORD, CHARS_PER_TOKEN = 12, 4
#: characters of scripts written without spaces between words: about a token each
_UNSPACED = re.compile("[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u2e80-\u2fdf\u3040-\u30ff"
                       "\u3100-\u31bf\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
                       "\U00020000-\U0003134f]")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


class _Item(Protocol):
    kind: str
    text: str
    date: str | None
    key: str | None
    ts: str | None


def approx_tokens(text: str) -> int:
    """Tokenizer-free estimate, rounded up: words × 1.3, long words and unspaced scripts by length
    (see the module doc)."""
    total = 0.0
    for word in text.split():
        wide = 0 if word.isascii() else len(_UNSPACED.findall(word))
        rest = len(word) - wide
        total += wide + (TOKENS_PER_WORD + max(0, rest - LONG_WORD) / CHARS_PER_TOKEN if rest else 0)
    return math.ceil(total)


def sort_key(item: _Item) -> tuple[str, str]:
    """The first ISO date of the item's date (ranges and "Before/After X" use X), else its session time."""
    found = _DATE.search(item.date or "")
    day = found.group(0) if found else (item.ts or "")[:10]
    return (day or "9999-99-99", item.ts or "")


def format_item(item: _Item) -> str:
    """One line: `[date] (kind) key: text` (the key only when the text does not start with it),
    then its validity: history, end of validity, contradiction (see the module doc)."""
    date = item.date or ((item.ts or "")[:10]) or "undated"
    text = " ".join((item.text or "").split())
    if item.key and not text.lower().startswith(item.key.lower()):
        text = f"{item.key}: {text}"
    return f"[{date}] ({item.kind}) {text}{validity_note(item)}"


def _clip(text: str, words: int = 30) -> str:
    parts = " ".join((text or "").split()).split(" ")
    return " ".join(parts[:words]) + (" ..." if len(parts) > words else "")


def validity_note(item: Any) -> str:
    """The validity suffix of a line ("" for a memory with no validity event)."""
    notes = []
    history = getattr(item, "history", None)
    since = (getattr(item, "valid_from", None) or getattr(item, "date", None)   # a turn: its own date
             or getattr(item, "ts", None) or "")[:10]
    if history:
        before = "; ".join(f"{_clip(h['text'])} [{h['date'] or 'undated'}]" for h in history[:3])
        stale = getattr(item, "superseded_by", None) or getattr(item, "updated_by", None)
        notes.append(f", {'from' if stale else 'current since'} {since or 'undated'} (before: {before})")
    if getattr(item, "superseded_by", None):
        until = (getattr(item, "valid_until", None) or "")[:10]
        notes.append(f" (no longer current since {until or 'a later memory'})")
    updated = getattr(item, "updated_by", None)
    if updated:
        notes.append(f" (updated [{updated['date'] or 'undated'}]: {_clip(updated['text'])})")
    other = getattr(item, "contradiction", None)
    if other:
        also = "".join(f"; also [{o['date'] or 'undated'}] {_clip(o['text'], 20)}"
                       for o in getattr(item, "also_contradicts", None) or [])
        notes.append(f" CONTRADICTS [{other['date'] or 'undated'}] {_clip(other['text'])}{also}: ask the user "
                     "which holds")
    return "".join(notes)


def is_profile(item: Any) -> bool:
    """The user's MemWeaver profile, pinned to a result as context rather than ranked evidence."""
    return getattr(item, "kind", None) == "summary" and getattr(item, "key", None) == PROFILE_KEY


def build_context(items: Iterable[Any], max_tokens: int = 1500, header: str = "Memories (oldest first):",
                  profile: Any = None) -> str:
    """The items that fit in `max_tokens` (rank order), printed chronologically, after the user's
    profile when the result carries one."""
    return fit_context(items, max_tokens, header, profile)[0]


def fit_context(items: Iterable[Any], max_tokens: int = 1500, header: str = "Memories (oldest first):",
                profile: Any = None) -> tuple[str, list[str]]:
    """`build_context`'s text and the ids of the memories it shows, in rank order (the profile's
    first): what a citation feedback may call shown."""
    items = list(items)
    profile = profile or next((it for it in items if is_profile(it)), None)
    head: list[str] = []
    shown: list[str] = []
    if profile is not None:
        items = [it for it in items if not is_profile(it)]
        text = f"User profile ({profile.date or 'undated'}):\n{(profile.text or '').strip()}"
        if approx_tokens(text) < max_tokens // 2:  # the profile never crowds out the memories
            head = [text, ""]
            shown.append(profile.id)
            max_tokens -= approx_tokens(text)
    budget = max_tokens - approx_tokens(header)
    chosen = []
    for item in items:
        line = "- " + format_item(item)
        cost = approx_tokens(line)
        if cost > budget:
            continue  # a long item does not block shorter, lower-ranked ones
        chosen.append((sort_key(item), line))
        shown.append(item.id)
        budget -= cost
    if not chosen:
        return "\n".join(head).strip(), shown
    chosen.sort(key=lambda c: c[0])
    return "\n".join(head + [header] + [line for _, line in chosen]), shown
