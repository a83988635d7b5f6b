"""Orchestration only: Prefect flows over shards of users, and the `mnemo` CLI.

This is the one package that imports Prefect; `memory/` and `retrieval/` never do.
"""
