"""The consolidation stages of one shard of users, one module each, in order:

    load -> extract -> embed -> supersede -> link -> reason -> embed-insights -> weave -> summarize -> topics -> commit

`load.load_shard` reads a shard's pending sessions into a `shard.ShardState`; every stage of
`STAGES` is a function `(state, context) -> state` that only reads the store (and the LLM response
cache) and leaves its rows in the state; `commit.commit` writes them all, watermarks last. A stage
never imports another stage: what they share is in `shard.py` and the memory core. `memory.pipeline`
runs the chain without Prefect; `flows/` runs each stage as a Prefect task.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from memory.errors import ConfigError
from memory.stages.embed import embed, embed_insights
from memory.stages.extract import extract
from memory.stages.link import link
from memory.stages.reason import reason
from memory.stages.shard import ShardState, StageContext
from memory.stages.summarize import summarize
from memory.stages.supersede import supersede
from memory.stages.topics import topics
from memory.stages.weave import weave


@dataclass(frozen=True)
class StageSpec:
    """One stage between load and commit: its name, its function, and whether a transient LLM error
    retries it."""

    name: str
    run: Callable[[ShardState, StageContext], ShardState]
    retryable: bool


#: the stages between load and commit, in order
STAGES: tuple[StageSpec, ...] = (
    StageSpec("extract", extract, True),           # PREMem step 1: fragments
    StageSpec("embed", embed, False),
    StageSpec("supersede", supersede, False),      # PREMem transformation acted on: close replaced fragments
    StageSpec("link", link, False),                # PREMem step 2a: clusters, cross-session links
    StageSpec("reason", reason, True),             # PREMem step 2b: insights
    StageSpec("embed-insights", embed_insights, False),
    StageSpec("weave", weave, False),              # MemWeaver graph: temporal edges + K-means semantic clusters
    StageSpec("summarize", summarize, True),       # MemWeaver cognitive memory: phase summaries -> global profile
    StageSpec("topics", topics, True),             # RMM prospective reflection: topic memories, Add / Merge
)


def stage(name: str) -> StageSpec:
    """The stage of that name."""
    for spec in STAGES:
        if spec.name == name:
            return spec
    raise ConfigError(f"unknown stage: {name!r} (known: {', '.join(s.name for s in STAGES)})",
                      name=name, known=[s.name for s in STAGES])
