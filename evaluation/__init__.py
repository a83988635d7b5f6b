"""Benchmarks that print figures, and the helpers they share.

- `common`: a scratch store, LoCoMo loading and consolidation, Recall@K, per-strategy evaluation,
  the paired bootstrap interval.
- `consolidate`: `mnemo bench consolidate`, throughput of ingest + consolidation.
- `locomo`: `mnemo bench locomo`, evidence Recall@K per LoCoMo category and strategy.
- `incremental`: `mnemo bench incremental`, two nightly batches against a rebuild.
- `latency`: `mnemo bench retrieval`, retrieval latency on a synthetic user.
- `rerank`: `mnemo bench rerank`, the RMM reranker trained from simulated citations.
- `beam`: `mnemo bench beam`, evidence Recall@K per BEAM ability and strategy, update-first, latency
  and consolidation cost per chat scale.
- `beam_report`: the printed report of `mnemo bench beam` (table, legend, consolidation cost, anchors).

Every benchmark takes an optional `Settings` (None: the defaults of `Settings()`); the CLI passes
the one it read from the environment. This package uses `memory` and `retrieval`, never `flows`.
"""
