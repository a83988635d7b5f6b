"""The embed stages: every new message and fragment of the shard in one batch (`embed`, after
extract), and the new insights (`embed_insights`, after reason), each insight citing the messages of
its closest parent fragments."""
from __future__ import annotations

from typing import Any

import numpy as np

from memory.stages.shard import ShardState, StageContext, all_fragments, timed
from memory.text import turn_text

#: an insight cites the message ids of at most this many parent fragments, the closest to it
MAX_SOURCE_PARENTS = 3


def embed(state: ShardState, ctx: StageContext) -> ShardState:
    """Embed every new message and fragment of the shard in one batch."""
    with timed(state, "embed"):
        embedder = ctx.embedder
        texts = [turn_text(m["speaker"], m["text"]) for m in state.message_rows] + [f["text"] for f in state.fragments]
        vecs = embedder.embed(texts)
        n = len(state.message_rows)
        for row, vec in zip(state.message_rows, vecs[:n]):
            row["vector"] = vec
            row["embed_model"] = embedder.model_name
        for row, vec in zip(state.fragments, vecs[n:]):
            row["vector"] = vec
    return state


def embed_insights(state: ShardState, ctx: StageContext) -> ShardState:
    """Embed the new insights and cite the messages of their closest parent fragments."""
    with timed(state, "embed"):
        if state.insights:
            vecs = ctx.embedder.embed([r["text"] for r in state.insights])
            fragments = all_fragments(state, ctx.store)
            fvecs = {fid: np.asarray(f["vector"], dtype=np.float32) for fid, f in fragments.items()}
            attribute_sources(vecs, state.insights, fvecs, fragments)
            for row, vec in zip(state.insights, vecs):
                row["vector"] = vec
    return state


def attribute_sources(insight_vecs: np.ndarray, rows: list[dict[str, Any]],
                      fragment_vecs: dict[str, np.ndarray], fragments: dict[str, dict[str, Any]]) -> None:
    """Set each insight's source_ids to the message ids of its closest parent fragments.

    Citing every parent would make one insight claim a whole cluster pair's messages.
    """
    for vec, row in zip(insight_vecs, rows):
        parents = [p for p in row["parent_ids"] if p in fragment_vecs]
        sims = np.array([float(vec @ fragment_vecs[p]) for p in parents])
        order = np.argsort(-sims, kind="stable")[:MAX_SOURCE_PARENTS]
        sources: list[str] = []
        for i in order:
            for sid in fragments[parents[i]]["source_ids"]:
                if sid not in sources:
                    sources.append(sid)
        row["source_ids"] = sources
