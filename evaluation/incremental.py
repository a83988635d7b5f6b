"""`mnemo bench incremental`: does a nightly, incremental consolidation end where a rebuild would?

The LoCoMo file is consolidated in two batches (the first half of every conversation's sessions,
then the rest) and a copy of that store is rebuilt from scratch (`rebuild_graph`: graph and
summaries re-woven over every memory). Both are scored with the same questions and strategies;
MemWeaver's incremental update (§3.3.3) is close enough when Recall@10 differs by < 0.01.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Sequence

from evaluation.common import evaluate, load_questions
from memory.ingest import ingest
from memory.runs import consolidate, open_store
from memory.settings import Settings
from retrieval.retriever import Retriever


def first_half(path: str, out: Path) -> None:
    """Write the LoCoMo file `path` to `out` with only the first half of every conversation's sessions."""
    data = json.loads(Path(path).read_text())
    for sample in data:
        conv = sample["conversation"]
        keys = sorted((k for k in conv if k.startswith("session_") and not k.endswith("date_time")),
                      key=lambda k: int(k.split("_")[1]))
        for k in keys[len(keys) // 2:]:
            conv.pop(k)
            conv.pop(k + "_date_time", None)
    out.write_text(json.dumps(data))


def bench_incremental(path: str, strategies: Sequence[str] = ("walk", "hybrid-walk", "rfmem-hybrid"),
                      settings: Settings | None = None) -> str:
    """Recall@10 per strategy of the two-batch store and of its rebuild, side by side.
    `settings` (default `Settings()`) gives every knob but the stores, the backend and `rebuild_graph`."""
    base = settings or Settings()
    with tempfile.TemporaryDirectory(prefix="mnemo-bench-incr-") as tmp:
        root = Path(tmp)
        first_half(path, root / "half.json")
        inc = base.with_overrides(store=str(root / "incremental"), llm="rules")
        st = open_store(inc)
        ingest(st, root / "half.json", "locomo")
        consolidate(st, inc)
        ingest(st, path, "locomo")
        consolidate(st, inc)
        shutil.copytree(root / "incremental", root / "rebuilt")
        reb = base.with_overrides(store=str(root / "rebuilt"), llm="rules", rebuild_graph=True)
        t = time.perf_counter()
        consolidate(open_store(reb), reb)
        rebuild_s = time.perf_counter() - t
        qs = load_questions(path, st)        # the rebuilt store holds the same turns
        retrievers = {name: Retriever(open_store(s), s) for name, s in (("incremental", inc), ("rebuilt", reb))}
        vecs = retrievers["incremental"].embed([q["question"] for q in qs])
        rows = {name: {n: evaluate(r, qs, vecs, n, (10,)) for n in strategies} for name, r in retrievers.items()}
        lines = [f"LoCoMo {Path(path).name}: two incremental batches vs a rebuild of the same store "
                 f"(rebuild took {rebuild_s:.1f} s)", "",
                 "| strategy | R@10 incremental | R@10 rebuilt | difference (goal < 0.01) |", "|---|---|---|---|"]
        for n in strategies:
            a, b = rows["incremental"][n]["R@10"], rows["rebuilt"][n]["R@10"]
            lines.append(f"| {n} | {a:.4f} | {b:.4f} | {abs(a - b):.4f} |")
        return "\n".join(lines)
