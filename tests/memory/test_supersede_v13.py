"""rules-supersede-v13: a quantity's cues and context words are read within `REACH` characters of it,
so parsing stays linear in a text's length (a pasted paragraph of numbers), while a number in a
normal sentence reads what it did before."""
from __future__ import annotations

from memory.llm.rules.supersede import REACH, SUPERSEDE_VERSION, quantities


def test_version() -> None:
    assert SUPERSEDE_VERSION == "rules-supersede-v13"


def test_context_is_read_within_reach() -> None:
    """A content word further back than REACH characters, with nothing but punctuation between, is
    no longer the number's context (v12 read the whole text before every number)."""
    far = "budget " + ". " * REACH + "my API latency is now 95ms"
    q = quantities(far)[-1]
    assert (q.value, q.unit, q.cued) == (95.0, "ms", True)
    assert "latency" in q.context and "budget" not in q.context
    near = "budget . my API latency is now 95ms"
    assert "budget" in quantities(near)[-1].context


def test_a_long_paragraph_reads_each_number_locally() -> None:
    """Each number of a 40 KB paragraph keeps its own unit, value and period, as it would alone."""
    rows = [f"sensor {i} answered in {i + 1}ms at {i % 50 + 1} calls per minute" for i in range(1500)]
    got = quantities("; ".join(rows))
    assert len(got) == 4500
    alone = quantities(rows[-1])
    assert [(q.value, q.unit, q.per) for q in got[-3:]] == [(q.value, q.unit, q.per) for q in alone]
