"""The reason stage, PREMem step 2b: insights over the shard's linked cluster pairs (five evolution
patterns), one LLM request per pair, all pairs of the shard in one batch. The insights are embedded
and attributed to source messages afterwards, by `embed_insights`. A pair whose answer is quarantined
stays pending on its session (`reason:<link id>`); a later run asks it again (`load.retry_links`).

With an LLM backend this is also where supersession is decided (issue 12): a transformation that
names the fragment it supersedes (`supersedes` / `superseded_by`, prompt `REASON_VERSION`) closes the
earlier fragment (`valid_until`, `superseded_by`, `supersede_version` = the prompt's version); the
`rules` backend decides in the supersede stage instead. Insights get `valid_from` = their session time."""
from __future__ import annotations

from typing import Any

import numpy as np

from memory import prompts
from memory.ids import make_id
from memory.stages.shard import (Cluster, Link, ShardState, StageContext, add_rows, all_fragments,
                                 quarantine_work, timed)


def reason(state: ShardState, ctx: StageContext) -> ShardState:
    """PREMem step 2 over every linked pair of the shard, as one LLM batch."""
    with timed(state, "reason"):
        if state.links:
            fragments = all_fragments(state, ctx.store)
            cap = ctx.settings.reason_max_fragments
            requests = [prompts.reason_request(pair_context(lk, fragments, cap)) for lk in state.links]
            with ctx.llm(state) as runner:
                backend = runner.backend
                answers, bad = runner.run(requests)
            new_ids = {f["id"] for f in state.fragments}
            for lk, answer in zip(state.links, answers):
                if answer is not None:
                    items = prompts.parse_reasoning(answer)
                    state.insights.extend(insight_rows(lk, items, run_id=state.run_id,
                                                       backend=backend.name, model=backend.model))
                    closed = [fragments[i] for i in close_superseded(pair_context(lk, fragments, cap), items,
                                                                     fragments)
                              if i not in new_ids]
                    if closed:
                        add_rows(state, "fragments", closed)
            by_link = {lk.id: lk for lk in state.links}
            mine = {(s.user_id, s.session_id) for s in state.sessions}
            retried = {i: s.session_id for s in state.sessions for i in s.reason_links}
            for q in bad:
                lk = by_link[q.request.context["link_id"]]
                # pending where it was (a retry), else on the side this shard consolidates (a late
                # session's link to a later session: the pool side)
                sid = retried.get(lk.id) or (lk.new.session_id if (lk.new.user_id, lk.new.session_id) in mine
                                             else lk.pool.session_id)
                quarantine_work(state, q.row(lk.new.user_id, state.run_id, lk.id), lk.new.user_id, sid,
                                f"reason:{lk.id}")
            state.insights = list({r["id"]: r for r in state.insights}.values())
    return state


def pair_context(link: Link, fragments: dict[str, dict[str, Any]], cap: int | None = None) -> dict[str, Any]:
    """The reasoning context of one linked pair: the fragments of p (earlier) and c (later); a late
    session's cluster c that is older than p comes first. With `cap`, each side keeps at most `cap`
    fragments, those nearest its centroid, in their stored order."""
    def view(cluster: Cluster) -> list[dict[str, Any]]:
        ids = [i for i in cluster.member_ids if i in fragments]
        if cap is not None and len(ids) > cap:
            keep = set(nearest(cluster, ids, fragments, cap))
            ids = [i for i in ids if i in keep]
        return [{k: fragments[i][k] for k in ("id", "subject", "category", "key", "content", "date",
                                                "source_ids")} for i in ids]

    earlier, later = link.pool, link.new
    if earlier.session_ts > later.session_ts:  # a late session linked to a pool cluster after it
        earlier, later = later, earlier
    return {"user_id": link.new.user_id, "link_id": link.id,
            "earlier": view(earlier), "later": view(later)}


def nearest(cluster: Cluster, ids: list[str], fragments: dict[str, dict[str, Any]], n: int) -> list[str]:
    """The `n` members of `cluster` whose vectors are nearest its centroid (cosine; ties by position)."""
    c = np.asarray(cluster.centroid, dtype=np.float32)
    vecs = np.stack([np.zeros_like(c) if fragments[i].get("vector") is None
                     else np.asarray(fragments[i]["vector"], dtype=np.float32) for i in ids])
    sims = vecs @ c / (np.linalg.norm(vecs, axis=1) * (np.linalg.norm(c) or 1.0) + 1e-12)
    order = np.argsort(-sims, kind="stable")[:n]
    return [ids[int(j)] for j in order]


def close_superseded(pair: dict[str, Any], items: list[dict[str, Any]],
                     fragments: dict[str, dict[str, Any]]) -> list[str]:
    """Close the fragments the answer's transformations say are superseded (1-based positions in the
    pair's earlier + later fragments); the closed ids. The one said later replaces the other whichever
    way the answer names them: a model that swaps the two must not close the current value."""
    order = [f["id"] for f in pair["earlier"] + pair["later"]]
    closed = []
    for it in items:
        old_i, new_i = it.get("supersedes"), it.get("superseded_by")
        if not old_i or not new_i or not (1 <= old_i <= len(order) and 1 <= new_i <= len(order)):
            continue
        old, new = fragments[order[old_i - 1]], fragments[order[new_i - 1]]
        if old.get("session_ts") and new.get("session_ts") and new["session_ts"] < old["session_ts"]:
            old, new = new, old
        if old["id"] == new["id"] or old.get("superseded_by"):
            continue
        since = new.get("valid_from") or (new["session_ts"].isoformat() if new.get("session_ts") else new["date"])
        old.update(valid_until=since, superseded_by=new["id"], supersede_version=prompts.REASON_VERSION)
        closed.append(old["id"])
    return closed


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
            "valid_from": link.new.session_ts.isoformat(),
        })
    return rows
