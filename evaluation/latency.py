"""`mnemo bench retrieval`: latency of one synthetic user with ~10k memories.

Memories are clustered random unit vectors (200 topics, so probes see realistic score structure)
with generated texts for the lexical channel, written with `Store.upsert` into `fragments`.
Queries are precomputed vectors near a topic, from close to vague (noise drawn per query, so the
gate sees both kinds; the recollection share is printed), with a few words of the topic
(embedding is outside the retrieval timings by design). Reported: warm median / p99 per strategy, rfmem vs familiarity,
and the cold first query of a user (version check + LanceDB read + BM25 build + calibration).
"""
from __future__ import annotations

import os
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from evaluation.common import scratch_store
from memory.ids import make_id
from memory.settings import Settings
from memory.store import Store
from retrieval.retriever import Retriever

DIM = 384
WORDS = ("hiking camping painting guitar piano swimming running cooking baking reading garden dog cat "
         "travel paris tokyo beach mountain lake school work project family sister brother mother father "
         "concert museum movie book coffee tea yoga soccer tennis bike car house birthday wedding friend "
         "doctor exam job interview promotion vacation dinner lunch recipe puppy kitten pottery photo").split()


def synthetic_rows(user: str, n: int, topics: int = 200, seed: int = 0) -> tuple[list[dict[str, Any]], np.ndarray]:
    """n fragment rows around `topics` random centers, and the centers."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((topics, DIM)).astype(np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    topic = rng.integers(0, topics, n)
    vecs = centers[topic] + 0.9 * rng.standard_normal((n, DIM)).astype(np.float32) / np.sqrt(DIM)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    t0 = datetime(2023, 1, 1, tzinfo=timezone.utc)
    rows = []
    for i in range(n):
        words = [WORDS[(topic[i] * 7 + j) % len(WORDS)] for j in range(3)] + list(rng.choice(WORDS, 12))
        text = f"memory {i}: " + " ".join(words)
        day = t0 + timedelta(days=int(i % 365))
        rows.append({"id": make_id(user, "bench", i), "user_id": user, "session_id": f"s{i // 20}",
                     "session_ts": day, "subject": "user", "category": "factual", "key": " ".join(words[:2]),
                     "content": text, "date": day.date().isoformat(), "text": text, "vector": vecs[i],
                     "source_ids": [f"m{i}"]})
    return rows, centers


def _stats(xs: list[float]) -> tuple[float, float]:
    return float(np.median(xs)), float(np.percentile(xs, 99))


def bench_retrieval(memories: int = 10_000, queries: int = 200, store: str | None = None,
                    settings: Settings | None = None) -> str:
    """Run the latency benchmark with single-threaded BLAS, as `mnemo serve` runs retrieval: one
    query's products are small, and a thread pool per product only waits on busy cores.
    `settings.retrieval` (default `Settings()`) configures the retriever."""
    with threadpool_limits(limits=1, user_api="blas"):
        return _bench(memories, queries, store, settings or Settings())


def _bench(memories: int, queries: int, store: str | None, cfg: Settings) -> str:
    with scratch_store(store, "mnemo-bench-retrieval-") as root:
        st = Store(root, dim=DIM, consistency_s=None)
        users = ["bench-user", "bench-cold-1", "bench-cold-2", "bench-cold-3", "bench-cold-4", "bench-cold-5"]
        rows, centers = synthetic_rows(users[0], memories)
        for i, u in enumerate(users[1:]):
            rows += synthetic_rows(u, memories, seed=i + 1)[0]
        t = time.perf_counter()
        st.upsert("fragments", rows)
        write_s = time.perf_counter() - t
        settings = cfg.retrieval
        r = Retriever(st, settings)
        rng = np.random.default_rng(1)
        qs = []
        for i in range(queries):
            c = int(rng.integers(0, len(centers)))
            noise = rng.uniform(0.4, 1.4)  # from close paraphrases to vague questions
            v = centers[c] + noise * rng.standard_normal(DIM).astype(np.float32) / np.sqrt(DIM)
            words = [WORDS[(c * 7 + j) % len(WORDS)] for j in range(2)]
            qs.append((v / np.linalg.norm(v), "what about " + " ".join(words)))
        default = settings.default_strategy
        # cold: the first query of users never seen by this process
        r.retrieve(users[0], qs[0][0], strategy=default, text=qs[0][1])
        cold = []
        for u in users[1:]:
            res = r.retrieve(u, qs[1][0], strategy=default, text=qs[1][1])
            cold.append(res.signals["timings"]["retrieve_ms"])
        lines = [f"single-threaded BLAS; machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}",
                 f"synthetic user: {memories} fragments (+{len(users) - 1} more users of the same size for cold "
                 f"starts), written in {write_s:.1f} s; {queries} queries per strategy, k=10, warm cache",
                 "", "| strategy | median ms | p99 ms | recollection share |", "|---|---|---|---|"]
        med: dict[str, float] = {}
        p99s: dict[str, float] = {}
        for name in dict.fromkeys(["familiarity", "rfmem", "recollection", "hybrid", "rfmem-hybrid",
                                   "calibrated", default]):
            for v, text in qs[:10]:
                r.retrieve(users[0], v, strategy=name, text=text)
            times, rec = [], 0
            for v, text in qs:
                res = r.retrieve(users[0], v, strategy=name, text=text)
                times.append(res.signals["timings"]["retrieve_ms"])
                rec += res.route == "recollection"
            med[name], p99s[name] = _stats(times)
            lines.append(f"| {name} | {med[name]:.2f} | {p99s[name]:.2f} | {rec / len(qs):.2f} |")
        ratio = med["rfmem"] / med["familiarity"]
        cold_med = float(np.median(cold))
        lines += ["",
                  f"warm familiarity median   {med['familiarity']:.2f} ms   (goal <= 5 ms)",
                  f"warm rfmem median         {med['rfmem']:.2f} ms = {ratio:.2f}x familiarity   (goal <= 1.5x)",
                  f"worst p99                 {max(p99s.values()):.2f} ms   (goal <= 50 ms)",
                  f"cold first query ({default}) median {cold_med:.1f} ms, max {max(cold):.1f} ms over "
                  f"{len(cold)} users   (goal <= 100 ms)"]
        return "\n".join(lines)
