"""English word lists shared by the sentence heuristics of consolidation (`memory.dates`,
`memory.text`) and of retrieval (`retrieval.instructions`): data only, so the retriever can read
them without importing a stage or a parser."""
from __future__ import annotations

__all__ = ["IRREGULAR_PAST"]

#: irregular simple-past verbs (the tense test of `memory.dates`; `rules` spots past-tense clauses
#: with them, and the retriever statements about oneself: "Never went ...")
IRREGULAR_PAST = (
    "went did saw met got took made ran bought brought caught taught thought felt found gave "
    "had was were won began sang swam drove rode wrote spoke broke chose fell flew grew knew "
    "left lost paid said sent spent sold told understood built heard kept led lent meant put "
    "read set sat slept stood struck swore threw wore woke ate drank came became forgot began "
    "held hung fought bit hid shot shook tore"
).split()
