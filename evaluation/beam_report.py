"""The printed report of `mnemo bench beam` (`evaluation.beam` measures): the per-strategy table,
the legend lines, consolidation cost and the raw-message anchors of ANCHORS.md, per scale."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from statistics import median
from typing import Sequence

from evaluation.beam import KS, UPDATE, Consolidation, ScaleResult, iter_beam
from evaluation.common import dense_legend
from memory.settings import Settings


def beam_reports(path: str, *, scales: Sequence[str] | None = None, strategies: Sequence[str] | None = None,
                 copies: int = 1, store: str | None = None, settings: Settings | None = None,
                 nightly_users: int = 0) -> Iterator[str]:
    """The printed report of each scale as soon as it is measured (see `iter_beam`)."""
    anchors = Path(path) / "ANCHORS.md"
    for res in iter_beam(path, scales=scales, strategies=strategies, copies=copies, store=store,
                         settings=settings, nightly_users=nightly_users):
        yield report(res, anchors, copies)


def bench_beam(path: str, *, scales: Sequence[str] | None = None, strategies: Sequence[str] | None = None,
               copies: int = 1, store: str | None = None, settings: Settings | None = None) -> str:
    """Run the benchmark (see `iter_beam`) and format one report per scale."""
    return "\n\n".join(beam_reports(path, scales=scales, strategies=strategies, copies=copies, store=store,
                                     settings=settings))


def short(ability: str) -> str:
    """`knowledge_update` -> `KU`."""
    return "".join(w[0] for w in ability.split("_")).upper()


def table(res: ScaleResult, ks: Sequence[int] = KS) -> str:
    """One Markdown row per strategy: R@{max K} per ability, overall R@K, update-first (over every
    question and over the decidable ones), latency and the number of queries it was timed on."""
    k = max(ks)
    head = ["strategy"] + [f"{short(a)} R@{k}" for a in res.abilities] + [f"R@{x}" for x in ks] + [
        "update-first", "uf decidable", "p50 ms", "p99 ms", "timed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in res.rows:
        name = row["strategy"] + (" (default)" if row["strategy"] == res.default_strategy else "")
        cells = [name] + [f"{row[f'R@{k} c{a}']:.3f}" for a in res.abilities] + [f"{row[f'R@{x}']:.3f}" for x in ks]
        cells += [f"{row['update-first']:.3f}", f"{row['uf decidable']:.3f}", f"{row['p50 ms']:.2f}",
                  f"{row['p99 ms']:.2f}", str(row["timed"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_message(seconds: float, messages: int, digits: int = 1) -> str:
    """Milliseconds per message; "n/a" with none consolidated (a reused store's seconds are no cost)."""
    return f"{1000 * seconds / messages:.{digits}f}" if messages else "n/a"


def consolidation_lines(c: Consolidation) -> list[str]:
    """Seconds per chat, per message and per stage; peak memory."""
    n, secs = max(1, len(c.chats)), [s for *_, s in c.chats]
    total_stages = sum(c.stages.values()) or 1e-9
    stages = ", ".join(f"{k} {v:.1f}s ({100 * v / total_stages:.0f}%)" for k, v in c.stages.items())
    per_chat = "; ".join(f"{u} {m} msg {s:.1f}s ({per_message(s, m, 0)} ms/msg)" for u, m, s in c.chats)
    return [f"consolidation: {len(c.chats)} chats, {c.messages} messages, {c.seconds:.1f} s = "
            f"{c.seconds / n:.1f} s/chat (min {min(secs, default=0):.1f}, max {max(secs, default=0):.1f}), "
            f"{per_message(c.seconds, c.messages)} ms/message; ingest {c.ingest_s:.1f} s, "
            f"model load {c.model_load_s:.1f} s (both before the clock); process CPU {c.cpu_s:.1f} s = "
            f"{per_message(c.cpu_s, c.messages)} ms/message",
            f"stages: {stages or 'none (already consolidated)'}",
            f"per chat: {per_chat}",
            f"peak RSS after consolidation {c.peak_mb:.0f} MiB (process max so far)"]


def anchor_lines(anchors: Path, scale: str) -> list[str]:
    """The raw-message anchors' table for `scale` from ANCHORS.md (its `## SCALE ...` section), if any."""
    if not anchors.is_file():
        return []
    out, inside = [], False
    for line in anchors.read_text().splitlines():
        if line.startswith("## "):
            inside = line[3:].startswith(scale + " ")
        elif inside and line.startswith("|"):
            out.append(line)
    head = (f"anchors (raw messages, no mnemo; per ability in {anchors}; measured on the text as published, "
            "`->-> i,j` markers kept, which mnemo strips: `mnemo bench beam-anchors` scores the stripped text):")
    return [head, *out] if out else [f"anchors: none for {scale} in {anchors}"]


def report(res: ScaleResult, anchors: Path, copies: int = 1) -> str:
    """The printed figures of one scale."""
    counts = {a: sum(q["ability"] == a for q in res.questions) for a in res.abilities}
    uf = res.rows[0]
    cold = res.cold_ms
    lines = [f"BEAM {res.scale}: {len(res.chats)} chats" + (f" x {copies} user copies" if copies > 1 else "")
             + f", {len(res.questions)} questions with evidence ({res.no_evidence} without, not scored), "
             f"memory of these chats' users {res.memory}"
             + (f" (their copies apart: {res.copies_memory})" if res.copies_memory else "")
             + f", default strategy {res.default_strategy}",
             "abilities (R@10 columns): " + ", ".join(f"{short(a)}={a} ({n})" for a, n in counts.items()),
             f"update-first: {UPDATE} at k={max(KS)}, {uf['uf n']} questions; a question where no updated "
             "message is in the top k (or one memory cites both first) counts as not first "
             "(neither/tie per strategy: " + ", ".join(f"{r['strategy']} {r['uf neither']}/{r['uf tie']}"
                                                       for r in res.rows) + ")",
             f"{uf['uf undecidable']} of the {uf['uf n']} undecidable (the updated message is an original one "
             f"too: never first); uf decidable = update-first over the other {uf['uf n'] - uf['uf undecidable']}",
             f"{dense_legend('messages', res.validity)}; latency = warm retrieve_ms at k={max(KS)} (questions "
             "embedded beforehand), timed = queries behind p50 / p99"]
    if res.missing_evidence:
        lines.append(f"WARNING: {res.missing_evidence} evidence ids are not stored messages")
    lines += ["", table(res), ""]
    lines += [f"cold first query ({res.default_strategy}) over {len(cold)} users: median "
              f"{median(cold) if cold else float('nan'):.1f} ms, max {max(cold, default=float('nan')):.1f} ms "
              f"(BM25 terms tokenized for {res.cold_tokenized} of {res.cold_rows} rows, read stored for the rest)"]
    lines += consolidation_lines(res.consolidation)
    lines += [f"peak RSS after retrieval {res.peak_mb:.0f} MiB"] + ([res.nightly] if res.nightly else []) + [""]
    lines += anchor_lines(anchors, res.scale)
    return "\n".join(lines)
