"""mnemo's consolidation side: plain Python over Arrow, Polars and NumPy (never Prefect).

The core (settings, store, schemas, ids, errors, embed, read, text, prompts, llm, ingest) sits under
`memory.stages`, one module per consolidation stage over a typed shard; `memory.pipeline` runs
load -> stages -> commit for one shard of users and `memory.runs` loops over shards without Prefect.
"""
