"""RMM retrospective-reflection citations (Tan et al., Appendix D.2): the prompt that asks the
answering LLM to cite the memories it used as `[i, j]` (or `[NO_CITE]`), and the parser that maps
those indices back to memory ids (the reward signal of the reranker RMM trains).
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

CITATION_PROMPT_VERSION = "rmm-d2-v1"

INSTRUCTIONS = """Task Description: Given a user query and a list of memories consisting of personal
summaries with their corresponding original turns, generate a natural and fluent response
while adhering to the following guidelines:

* Cite useful memories using [i], where i corresponds to the index of the cited memory.
* Do not cite memories that are not useful. If no useful memory exist, output [NO_CITE].
* Each memory is independent and may repeat or contradict others. The response must
  be directly supported by cited memories.
* If the response relies on multiple memories, list all corresponding indices, e.g.,
  [i, j, k].
* The citation is evaluated based on whether the response references the original turns,
  not the summaries.

Examples:
Case 1: Useful Memories Found
INPUT:
* User Query: SPEAKER_1: What hobbies do I enjoy?
* Memories:
  - Memory [0]: SPEAKER_1 enjoys hiking and often goes on weekend trips.
    * Speaker 1: I love spending my weekends hiking in the mountains.
      Speaker 2: That sounds amazing! Do you go alone or with friends?
  - Memory [1]: SPEAKER_1 plays the guitar and occasionally performs at open mics.
    * Speaker 1: I've been practicing guitar for years and love playing at open mics.
      Speaker 2: That's awesome! What songs do you usually play?
  - Memory [2]: SPEAKER_1 is interested in astronomy and enjoys stargazing.
    * Speaker 1: I recently bought a telescope to get a closer look at planets.
      Speaker 2: That's so cool! What have you seen so far?

Output: You enjoy hiking, playing the guitar, and stargazing. [0, 1, 2]

Case 2: No Useful Memories
INPUT:
* User Query: SPEAKER_1: What countries did I go to last summer?
* Memories:
  - Memory [0]: SPEAKER_1 enjoys hiking and often goes on weekend trips.
    * Speaker 1: I love spending my weekends hiking in the mountains.
      Speaker 2: That sounds amazing! Do you go alone or with friends?
  - Memory [1]: SPEAKER_1 plays the guitar and occasionally performs at open mics.
    * Speaker 1: I've been practicing guitar for years and love playing at open mics.
      Speaker 2: That's awesome! What songs do you usually play?

Output: I don't have enough information to answer that. [NO_CITE]

Additional Instructions:
* Ensure the response is fluent and directly answers the user's query.
* Always cite the useful memory indices explicitly.
* The citation is evaluated based on whether the response references the original turns,
  not the summaries.
* Follow the format of the examples provided above."""

_CITE = re.compile(r"\[\s*(NO_CITE|\d+(?:\s*,\s*\d+)*)\s*\]", re.IGNORECASE)


def format_memories(items: Sequence[Any], turns: Mapping[str, str] | None = None) -> str:
    """`- Memory [i]: text` per item, followed by its original turns when `turns` knows them."""
    lines = []
    for i, item in enumerate(items):
        lines.append(f"  - Memory [{i}]: {' '.join(item.text.split())}")
        quoted = [turns[s] for s in item.source_ids if turns and s in turns and turns[s] != item.text]
        for t in quoted:
            lines.append(f"    * {' '.join(t.split())}")
    return "\n".join(lines)


def citation_prompt(query: str, items: Sequence[Any], turns: Mapping[str, str] | None = None) -> str:
    """The D.2 prompt for one query over the retrieved items (indices are positions in `items`)."""
    return (f"{INSTRUCTIONS}\n\nInput:\n* User Query: {query}\n* Memories:\n"
            f"{format_memories(items, turns)}\n\nOutput:")


def parse_citations(response: str, items: Sequence[Any]) -> list[str] | None:
    """Memory ids cited by the response, in first-cited order; [] for [NO_CITE]; None when the
    response carries no citation at all. Indices outside the item list are ignored."""
    found = _CITE.findall(response or "")
    if not found:
        return None
    cited: list[str] = []
    for group in found:
        if group.upper() == "NO_CITE":
            continue
        for num in group.split(","):
            i = int(num)
            if 0 <= i < len(items) and items[i].id not in cited:
                cited.append(items[i].id)
    return cited
