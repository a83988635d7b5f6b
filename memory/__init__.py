"""mnemo's consolidation side: plain Python over Arrow, Polars and NumPy (never Prefect).

Stages (ingest, extract, embed, link, reason) are functions over batches; `memory.pipeline`
chains them for one shard of users and `flows/` only orchestrates.
"""
