"""The `summarize` and `profile` rules: MemWeaver cognitive memory (Tables 4 and 5), extractively."""
from __future__ import annotations

from typing import Any

from memory.llm.rules.registry import rule
from memory.text import cap_words, content_tokens

__all__ = ["central_order", "summarize_answer", "profile_answer"]

def central_order(texts: list[str]) -> list[int]:
    """Indices of `texts`, most central first: the sum of TF-IDF cosines to the other texts
    (ties by position). What the `rules` summaries pick instead of writing prose."""
    import math
    from collections import Counter

    toks = [content_tokens(t, set()) for t in texts]
    df = Counter(tok for ts in toks for tok in ts)
    n = len(texts)
    vecs = []
    for ts in toks:
        w = {t: math.log((1 + n) / (1 + df[t])) + 1.0 for t in ts}
        norm = math.sqrt(sum(v * v for v in w.values())) or 1.0
        vecs.append({t: v / norm for t, v in w.items()})
    cent = [sum(sum(a.get(t, 0.0) * v for t, v in b.items()) for j, b in enumerate(vecs) if j != i)
            for i, a in enumerate(vecs)]
    return sorted(range(n), key=lambda i: (-cent[i], i))


#: a phase summary quotes about one fragment in eight, between one and five
_SUMMARY_PER = 8
_SUMMARY_MAX = 5


@rule("summarize")
def summarize_answer(ctx: dict[str, Any]) -> dict[str, Any]:
    """Table 4, extractively: the phase's most central fragments, in time order."""
    items = ctx["items"]
    texts = [it["text"] for it in items]
    n_pick = min(_SUMMARY_MAX, max(1, -(-len(texts) // _SUMMARY_PER)))
    picked = sorted(central_order(texts)[:n_pick])
    body = "; ".join(cap_words(texts[i], 30) for i in picked)
    return {"summary": f"From {ctx['start']} to {ctx['end']}: {body}."}


@rule("profile")
def profile_answer(ctx: dict[str, Any]) -> dict[str, Any]:
    """Table 5, extractively: the most central phase summaries as bullets, oldest first, ≤ 300 words."""
    texts = [s["text"] for s in ctx["summaries"]]
    budget, picked = 290, []
    for i in central_order(texts):
        cost = len(texts[i].split()) + 1
        if cost > budget:
            continue
        picked.append(i)
        budget -= cost
    if not picked and texts:  # one very long summary: cut it
        return {"profile": "- " + " ".join(texts[0].split()[:290])}
    return {"profile": "\n".join("- " + texts[i] for i in sorted(picked)) or "- (no history yet)"}
