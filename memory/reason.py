"""PREMem step 2b: insights over linked cluster pairs (five evolution patterns)."""
from __future__ import annotations

from typing import Any

import numpy as np

from memory import prompts
from memory.ids import make_id
from memory.link import Link

#: an insight cites the message ids of at most this many parent fragments, the closest to it
MAX_SOURCE_PARENTS = 3


def pair_context(link: Link, fragments: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The reasoning context of one linked pair: the fragments of p (earlier) and c (later)."""
    def view(ids: list[str]) -> list[dict[str, Any]]:
        return [{k: fragments[i][k] for k in ("id", "subject", "category", "key", "content", "date",
                                                "source_ids")} for i in ids if i in fragments]

    return {"user_id": link.new.user_id, "link_id": link.id,
            "earlier": view(link.pool.member_ids), "later": view(link.new.member_ids)}


def insight_rows(link: Link, items: list[dict[str, Any]], *, run_id: str, backend: str, model: str) -> list[dict[str, Any]]:
    """Insights-table rows (without vector and source_ids) for one pair's parsed answer."""
    parents = list(link.pool.member_ids) + list(link.new.member_ids)
    rows = []
    for it in items:
        iid = make_id(link.new.user_id, link.id, it["inference_type"], it["key"], it["content"],
                      prompts.REASON_VERSION)
        rows.append({
            "id": iid, "user_id": link.new.user_id, "session_id": link.new.session_id,
            "session_ts": link.new.session_ts, "link_id": link.id, "inference_type": it["inference_type"],
            "key": it["key"], "content": it["content"], "date": it["date"],
            "text": f"{it['key']}: {it['content']}", "parent_ids": parents, "run_id": run_id,
            "backend": backend, "model": model, "prompt_version": prompts.REASON_VERSION,
        })
    return rows


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
