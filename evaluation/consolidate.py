"""`mnemo bench consolidate`: throughput of ingest + consolidation with the `rules` backend.

The headline figure is the ratio of total wall time to the time the embedder alone needs to
embed every text the run embedded (measured again afterwards, in one call): how much the
pipeline costs beyond its unavoidable embedding work. Model loading happens before the clock
starts and is reported on its own line.
"""
from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from evaluation.common import scratch_store
from memory.embed import Embedder, embedder_for
from memory.ingest import ingest
from memory.runs import consolidate, open_store
from memory.settings import Settings


@contextmanager
def _recording(embedder: Embedder) -> Iterator[list[str]]:
    """Every text `embedder.embed` is given meanwhile, in order (the process-wide embedder the
    pipeline uses, so its calls are seen)."""
    texts: list[str] = []
    embed = embedder.embed

    def recording_embed(batch: list[str]) -> np.ndarray:
        vecs = embed(batch)
        texts.extend(batch)
        return vecs

    embedder.embed = recording_embed  # type: ignore[method-assign, assignment]
    try:
        yield texts
    finally:
        del embedder.embed  # back to the class's method


def bench_consolidate(path: str, fmt: str = "locomo", *, store: str | None = None,
                      settings: Settings | None = None) -> str:
    """Ingest and consolidate `path` into `store` (default: a temporary one) and report throughput.
    `settings` (default `Settings()`) gives every knob but the store and the backend."""
    with scratch_store(store, "mnemo-bench-") as root:
        return _bench_consolidate(path, fmt, (settings or Settings()).with_overrides(store=root, llm="rules"))


def _bench_consolidate(path: str, fmt: str, settings: Settings) -> str:
    t0 = time.perf_counter()
    embedder = embedder_for(settings)
    embedder.embed(["warm up"])
    load_s = time.perf_counter() - t0
    embedder.seconds, embedder.texts = 0.0, 0

    st = open_store(settings)
    with _recording(embedder) as texts:
        start = time.perf_counter()
        ing = ingest(st, path, fmt)
        ingest_s = time.perf_counter() - start
        report = consolidate(st, settings)
        wall = time.perf_counter() - start
    run_embed_s, n_texts = embedder.seconds, embedder.texts

    t1 = time.perf_counter()
    embedder.embed(texts)
    alone_s = time.perf_counter() - t1

    t2 = time.perf_counter()
    again = consolidate(st, settings)
    second_s = time.perf_counter() - t2
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    c = report.counts
    lines = [
        f"archive            {path} ({fmt})",
        f"users / sessions   {c.get('users', 0)} / {c.get('sessions', 0)}",
        f"messages           {ing.messages_added} ingested, {c.get('messages', 0)} consolidated",
        f"fragments          {c.get('fragments', 0)}",
        f"clusters / links   {c.get('clusters', 0)} / {c.get('links', 0)}",
        f"insights           {c.get('insights', 0)}",
        f"quarantined        {ing.quarantined} at ingest, {c.get('quarantined', 0)} in consolidation",
        f"model load         {load_s:.2f} s (before the clock)",
        f"wall time          {wall:.2f} s (ingest {ingest_s:.2f} s, consolidate {report.seconds:.2f} s)",
        f"stages             " + ", ".join(f"{k} {v:.2f}s" for k, v in report.timings.items()),
        f"throughput         {c.get('sessions', 0) / wall:.1f} sessions/s, {c.get('messages', 0) / wall:.0f} messages/s",
        f"embedding in run   {n_texts} texts, {run_embed_s:.2f} s",
        f"embedder alone     {len(texts)} texts, {alone_s:.2f} s",
        f"wall / embedder    {wall / alone_s:.2f}  (goal <= 1.5)",
        f"second run         {second_s:.2f} s = {100 * second_s / wall:.1f} % of the first (goal < 10 %), "
        f"{again.counts.get('sessions', 0)} sessions",
        f"peak memory        {peak_mb:.0f} MiB (max RSS)",
    ]
    return "\n".join(lines)
