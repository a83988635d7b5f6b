"""`mnemo bench updates`: does retrieval know what is current? On the BEAM development chats, per
scale, with the default strategy at k = 10 and validity ordering on vs off (`RetrievalSettings.validity`):

* **update-first** (knowledge_update): share of questions whose first ranked memory citing an
  `updated_info` message comes before the first citing an `original_info` one (evaluation.beam's
  `UpdateFirst`: no updated message in the top k, or a tie, counts as not first); also over the
  decidable questions only (one whose updated message is an original one too is never first);
* **updated R@10**: Recall@10 of the `updated_info` messages alone (and of all KU evidence);
* **contradictions** (contradiction_resolution): share of questions with a message of each
  statement in the top 10 (`both`), and of those where `context()` also flags the pair
  (`flagged`: an item citing one statement carries a contradiction with a memory citing the other,
  returned or not, and the default context() shows that item, its line saying "CONTRADICTS"; the
  pinned profile is no item); both over every question (as
  first printed) and over those whose two statements are different messages (a question naming one
  message for both finds "both" with that one message);
* overall R@10 over every ability, to show what the ordering costs elsewhere.

Stores: `--store ROOT` uses `ROOT/SCALE` as it is (chats already consolidated there are not
consolidated again; fragments never examined by the supersede stage are examined first, with
`memory.stages.supersede.supersede_user`, idempotent); without it each scale is consolidated into a
temporary store with the `rules` backend (the supersede stage runs as part of consolidation).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from evaluation.beam import UpdateFirst, consolidate_scale, load_questions, requested_scales, scale_chats
from evaluation.common import first_sources, recall_at, scratch_store
from memory.embed import Embedder, embedder_for
from memory.ingest.beam import beam_user
from memory.runs import open_store
from memory.settings import Settings
from memory.stages.supersede import supersede_user
from memory.store import Store
from retrieval.context import is_profile
from retrieval.retriever import RetrievalResult, Retriever

K = 10
CONTRADICTION = "contradiction_resolution"


def statement_sides(chat_dir: Path) -> list[tuple[str, set[str], set[str]]]:
    """(question, first statement's message ids, second's) of every contradiction question."""
    from evaluation.beam import evidence_ids

    data = json.loads((chat_dir / "probing_questions.json").read_text())
    out = []
    for item in data.get(CONTRADICTION, []):
        src = item.get("source_chat_ids")
        parts = list(src.values()) if isinstance(src, dict) else list(src or [])
        if len(parts) < 2 or not str(item.get("question", "")).strip():
            continue
        a, b = evidence_ids(parts[0]), evidence_ids(parts[1:])
        if a and b:
            out.append((item["question"], a, b))
    return out


def top_sources(res: RetrievalResult, k: int = K) -> set[str]:
    """The first k distinct source ids of a result (`common.first_sources`: the pinned profile skipped)."""
    return first_sources(res.items, k)


def flagged(res: RetrievalResult, a: set[str], b: set[str],
            sources_of: Callable[[str], list[str]] | None = None) -> bool:
    """An item citing one statement carries a contradiction with a memory citing the other, and the
    context the assistant gets (`context()` at its default budget) shows that item, whose line says
    "CONTRADICTS". The counterpart is a returned item, or (with `sources_of`: memory id -> its
    source ids) any memory: context() prints its text either way, and a turn that contradicts
    itself ("I've never done X, but I recently did X") is flagged against its own fragment."""
    if sources_of is None:
        by_id = {it.id: list(it.source_ids) for it in res.items}
        sources_of = lambda cid: by_id.get(cid, [])   # noqa: E731
    shown_ids = set(res.context_shown()[1])
    for it in res.items:
        if is_profile(it) or it.id not in shown_ids:
            continue
        for other in ([it.contradiction] if it.contradiction else []) + (it.also_contradicts or []):
            x, y = set(it.source_ids), set(sources_of(other.get("id", "")))
            if (x & a and y & b) or (x & b and y & a):
                return True
    return False


def memory_sources(r: Retriever, user_id: str) -> Callable[[str], list[str]]:
    """memory id -> its source ids, from the user's index (for `flagged`)."""
    index = r.cache.get(user_id)

    def of(memory_id: str) -> list[str]:
        row = index.row_of_id().get(memory_id)
        return [] if row is None else index.source_ids(row)
    return of


def ensure_examined(st: Store, users: Sequence[str], skip: Sequence[str] | None = None,
                    embedder: Embedder | None = None) -> dict[str, int]:
    """Run the supersede decisions on fragments never examined (an older store, or one decided by an
    older rules version), with change fragments when given the store's `embedder`; totals. `skip`:
    the assistants' speaker names (their turns are not searched)."""
    total: dict[str, int] = {}
    for u in users:
        for key, n in supersede_user(st, u, skip, embedder).items():
            total[key] = total.get(key, 0) + n
    return total


def validity_counts(st: Store, users: Sequence[str]) -> dict[str, int]:
    """Fragments, superseded ones and contradiction flags of these users."""
    out = {"fragments": 0, "superseded": 0, "contradicts": 0}
    for u in users:
        t = st.read("fragments", u, columns=["superseded_by", "contradicts"])
        out["fragments"] += t.num_rows
        out["superseded"] += t.num_rows - t.column("superseded_by").null_count
        out["contradicts"] += t.num_rows - t.column("contradicts").null_count
    return out


def measure(st: Store, cfg: Settings, questions: list[dict[str, Any]],
            sides: list[tuple[str, str, set[str], set[str]]]) -> dict[str, Any]:
    """Every figure of the module doc, validity on and off."""
    out: dict[str, Any] = {}
    ku = [q for q in questions if q.get("updated")]
    texts = [q["question"] for q in questions] + [s[1] for s in sides]
    for mode in (True, False):
        r = Retriever(st, cfg.with_overrides(retrieval={**cfg.retrieval.model_dump(), "validity": mode}))
        vecs = r.embed(texts) if texts else np.zeros((0, st.dim), dtype=np.float32)
        uf = UpdateFirst()
        upd, ku_all, overall, both, flag, same = [], [], [], [], [], []
        for q, v in zip(questions, vecs):
            res = r.retrieve(q["user"], v, k=K, text=q["question"])
            overall.append(recall_at(res.items, q["evidence"], K))
            if q.get("updated"):
                uf(q, res)
                upd.append(recall_at(res.items, q["updated"], K))
                ku_all.append(recall_at(res.items, q["evidence"], K))
        for (user, text, a, b), v in zip(sides, vecs[len(questions):]):
            res = r.retrieve(user, v, k=K, text=text)
            top = top_sources(res)
            both.append(bool(top & a and top & b))
            same.append(a == b)
            flag.append(both[-1] and flagged(res, a, b, memory_sources(r, user)))
        tag = "on" if mode else "off"
        out[tag] = {"update-first": uf.row()["update-first"], "uf n": uf.n, "updated R@10": _mean(upd),
                    "uf decidable": uf.row()["uf decidable"], "uf undecidable": uf.undecidable,
                    "KU R@10": _mean(ku_all), "R@10": _mean(overall), **cr_figures(both, flag, same),
                    "KU n": len(ku)}
    return out


def cr_figures(both: Sequence[bool], flag: Sequence[bool], same: Sequence[bool]) -> dict[str, Any]:
    """The contradiction figures: over every question (`CR both`, `CR flagged`, as first printed) and
    over those with two distinct statements (`CR both 2`, `CR flagged 2`); `CR same n`: how many
    questions name one message for both statements (their "both" is that one message found)."""
    two = [i for i, s in enumerate(same) if not s]
    return {"CR both": _mean(both), "CR flagged": _mean(flag), "CR n": len(both), "CR same n": sum(same),
            "CR both 2": _mean([both[i] for i in two]), "CR flagged 2": _mean([flag[i] for i in two])}


def _mean(xs: Sequence[float | bool]) -> float:
    return float(np.mean([float(x) for x in xs])) if xs else float("nan")


def run_scale(root: Path, scale: str, store_dir: str, cfg: Settings) -> dict[str, Any]:
    """Consolidate (or reuse) one scale's store and measure it."""
    chats = scale_chats(root, scale)
    cfg = cfg.with_overrides(store=store_dir, llm="rules")
    st = open_store(cfg)
    users = [beam_user(c) for c in chats]
    t0 = time.perf_counter()
    done = set(st.read("watermarks", columns=["user_id"]).column("user_id").to_pylist()) \
        if st.has_table("watermarks") else set()
    if not all(u in done for u in users):
        consolidate_scale(st, [c for c in chats if beam_user(c) not in done], cfg, 1)
    examined = ensure_examined(st, users, cfg.retrieval.assistant_speakers, embedder_for(cfg))
    prep_s = time.perf_counter() - t0
    questions: list[dict[str, Any]] = []
    sides: list[tuple[str, str, set[str], set[str]]] = []
    for chat, user in zip(chats, users):
        questions += load_questions(chat.parent, user)[0]
        sides += [(user, q, a, b) for q, a, b in statement_sides(chat.parent)]
    figures = measure(st, cfg, questions, sides)
    return {"scale": scale, "chats": len(chats), "questions": len(questions), "figures": figures,
            "counts": validity_counts(st, users), "examined": examined, "prep_s": prep_s}


def report(res: dict[str, Any]) -> str:
    """The printed figures of one scale."""
    on, off = res["figures"]["on"], res["figures"]["off"]
    decidable, two = on["KU n"] - on["uf undecidable"], on["CR n"] - on["CR same n"]
    rows = [("update-first (KU, top-10)", "update-first"),
            (f"update-first, the {decidable} decidable KU questions", "uf decidable"),
            ("updated-message R@10 (KU)", "updated R@10"),
            ("KU evidence R@10", "KU R@10"), ("CR both statements in top-10", "CR both"),
            ("CR both + flagged in context()", "CR flagged"),
            (f"CR both statements in top-10, the {two} with two", "CR both 2"),
            (f"CR both + flagged, the {two} with two", "CR flagged 2"), ("overall R@10 (every ability)", "R@10")]
    lines = [f"BEAM {res['scale']} updates: {res['chats']} chats, {on['KU n']} knowledge_update and "
             f"{on['CR n']} contradiction_resolution questions ({res['questions']} with evidence), default "
             f"strategy, k={K}",
             f"store: {res['counts']['fragments']} fragments, {res['counts']['superseded']} superseded, "
             f"{res['counts']['contradicts']} contradiction flags; examined now {res['examined']} "
             f"({res['prep_s']:.1f} s incl. any consolidation)", "",
             "| figure | validity on | off | on - off |", "|---|---|---|---|"]
    for label, key in rows:
        lines.append(f"| {label} | {on[key]:.3f} | {off[key]:.3f} | {on[key] - off[key]:+.3f} |")
    lines += ["", f"KU questions undecidable for update-first (the updated message is an original one too: never "
                  f"first): {on['uf undecidable']} of {on['KU n']}",
              f"CR questions naming one message for both statements: {on['CR same n']} of {on['CR n']}; over the "
              f"{two} with two (validity on): both {on['CR both 2']:.3f}, flagged {on['CR flagged 2']:.3f}"]
    return "\n".join(lines)


def bench_updates(path: str, *, scales: Sequence[str] | None = None, store: str | None = None,
                  settings: Settings | None = None) -> str:
    """Run the benchmark on every requested scale (default: every scale folder under `path`)."""
    root = Path(path)
    cfg = settings or Settings()
    out = []
    for scale in requested_scales(root, scales):
        with scratch_store(str(Path(store) / scale) if store else None, f"mnemo-updates-{scale}-") as st_dir:
            out.append(report(run_scale(root, scale, st_dir, cfg)))
    return "\n\n".join(out)
