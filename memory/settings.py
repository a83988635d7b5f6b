"""One settings object: environment variables prefixed `MNEMO_`, overridable by CLI flags.

Read only at the edges (CLI, flows, HTTP service); library code takes explicit arguments.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every knob of mnemo, with defaults that run on one laptop with no GPU and no network."""

    model_config = SettingsConfigDict(env_prefix="MNEMO_", extra="ignore")

    store: str = Field("./memstore", description="LanceDB directory or object-store URI")

    # embedder
    embedder: str = "sentence-transformers"
    embed_model: str = Field("", description="model name or path; empty = packaged all-MiniLM-L6-v2")
    embed_batch_size: int = 64
    embed_device: str = "cpu"

    # LLM
    llm: str = "rules"
    llm_model: str = Field("", description="model name for openai/vllm/replay; empty = backend default")
    llm_base_url: str = "http://127.0.0.1:8000/v1"
    llm_api_key: SecretStr | None = None
    llm_concurrency: int = 8
    llm_timeout_s: float = 120.0
    llm_max_retries: int = 3
    llm_max_tokens: int = 2048
    llm_temperature: float = 0.0

    # PREMem linking
    theta: float = Field(0.6, description="centroid cosine above which clusters link (PREMem θ)")
    max_clusters: int = 8

    # MemWeaver
    rebuild_graph: bool = Field(False, description="rebuild each user's graph and summaries from scratch")

    # RMM topics
    topic_merge_threshold: float = Field(0.75, ge=-1.0, le=1.0, description="cosine above which the `rules` "
                                         "backend merges a new topic into the most similar existing one")

    # orchestration
    shard_size: int = 8
    max_workers: int = 2
    task_runner: Literal["threads", "dask"] = "threads"
    dask_local: int = 0
    dask_address: str | None = None

    def with_overrides(self, **overrides: Any) -> "Settings":
        """A copy with the non-None overrides applied (CLI flags win over the environment)."""
        clean = {k: v for k, v in overrides.items() if v is not None}
        return self.model_copy(update=clean)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings read from the environment once."""
    return Settings()
