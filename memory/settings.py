"""One settings object for all of mnemo, read from the environment once, at the edges.

`load_settings()` is the only place that reads the environment: variables prefixed `MNEMO_`, the
retriever's section as `MNEMO_RETRIEVAL_*` (`MNEMO_RETRIEVAL_K=5` sets `settings.retrieval.k`) and the
service key as `MNEMO_API_KEY`. The CLI, the flows and the service call it and pass the result down
(to Prefect tasks and Dask workers as data); library code takes a `Settings` argument, and a bare
`Settings()` is the documented defaults, whatever the environment says.

Retrieval defaults: RF-Mem's come from the paper (Appendix B, PersonaMem turn-level setup): λ = 20,
B = 3, F = 2, θ_low = 0.3; α = 0.5 from the sensitivity study (Appendix D.2, D.4). The round cap R is
not given in the paper; its case study (Appendix D.7) shows three rounds, so R = 3. Two values differ
from the paper, both chosen on the LoCoMo dev split (bench/RESULTS.md says how): θ_high = 0.45 (paper
0.6) and τ = 0.85 on the entropy normalized by log k (the paper's τ is on its own, unnormalized scale,
see retrieval/rfmem.py). `PAPER` keeps the published values.
"""
from __future__ import annotations

import difflib
import logging
import os
import re
from functools import lru_cache
from typing import Annotated, Any, Literal, Mapping

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from memory.schemas import MEMORY_TABLES

log = logging.getLogger(__name__)


#: the published RF-Mem hyperparameters (PersonaMem, Appendix B / D.2), for reference and overrides
PAPER = {"lam": 20.0, "beam": 3, "fanout": 2, "theta_high": 0.6, "theta_low": 0.3, "tau": 0.25, "alpha": 0.5,
         "entropy_normalized": False}


def _not_blank(key: SecretStr) -> SecretStr:
    """A service key that is set must be a key: `MNEMO_API_KEY=` (an unset variable in a deployment file)
    would otherwise read as "no key" and open every route."""
    if not key.get_secret_value().strip():
        raise ValueError("the API key is set but blank; give a key, or unset the variable to run without one")
    return key


#: a bearer key: blank values are refused rather than read as "no key"
ApiKey = Annotated[SecretStr, AfterValidator(_not_blank)]


def _store_given(uri: str) -> str:
    """A store that is set must name one: `MNEMO_STORE=` would otherwise be the current folder."""
    if not uri.strip():
        raise ValueError("the store is set but blank; give a directory or URI (--store, MNEMO_STORE), or "
                         "unset MNEMO_STORE for ./memstore")
    return uri


#: a store directory or URI: blank values are refused rather than read as the current folder
StoreUri = Annotated[str, AfterValidator(_store_given)]

#: the devices the torch embedder runs on: torch's device types, with an optional index (torch is not
#: imported to ask it: settings load in every command, the 2-second no-op nightly included)
DEVICE = re.compile(r"(cpu|cuda|mps|xpu|hpu|npu|xla|mtia|ipu|meta|privateuseone)(:\d+)?")


def _known_device(device: str) -> str:
    """A torch device the embedder can run on (torch would fail only when the model first loads)."""
    if not DEVICE.fullmatch(device):
        raise ValueError(f"unknown device {device!r} (known: cpu, cuda, mps, xpu, hpu, npu, xla, each with an "
                         "optional :N)")
    return device


def kinds_problem(kinds: tuple[str, ...]) -> str | None:
    """What is wrong with searched memory `kinds` (None: nothing): none given, or a kind no table holds
    (`memory.schemas.MEMORY_TABLES`), which would be searched nowhere. One check for the settings and
    for a query's `kinds` (`retrieval.retriever.check_kinds`)."""
    known = ", ".join(MEMORY_TABLES)
    if not kinds:
        return f"kinds is empty (no memory kind given): leave it out for the default, or name some of: {known}"
    unknown = [k for k in kinds if k not in MEMORY_TABLES]
    return f"unknown memory kinds {unknown[:5]} (known: {known})" if unknown else None


def _known_kinds(kinds: tuple[str, ...]) -> tuple[str, ...]:
    """The settings' searched kinds, checked (`kinds_problem`)."""
    if problem := kinds_problem(kinds):
        raise ValueError(problem)
    return kinds


class RetrievalSettings(BaseModel):
    """Every knob of the online retriever: the `retrieval` section of `Settings`
    (environment variables `MNEMO_RETRIEVAL_*`)."""

    model_config = ConfigDict(extra="forbid")

    # what a plain call does
    default_strategy: str = Field("rfmem-hybrid", description="strategy used when none is asked for")
    k: int = Field(10, ge=1, le=200, description="items returned by default")
    kinds: Annotated[tuple[str, ...], AfterValidator(_known_kinds)] = Field(
        ("message", "fragment", "insight", "topic"), description="memory kinds searched by default (known: "
        "memory.schemas.MEMORY_TABLES; `mnemo bench rerank` measures what topics add)")

    # RF-Mem probe and gate (paper §2.1, Appendix B)
    probe_k: int = Field(10, ge=2, description="probe size k_p (the paper uses K)")
    lam: float = Field(20.0, gt=0, description="softmax sharpness λ")
    theta_high: float = 0.45
    theta_low: float = 0.3
    tau: float = Field(0.85, description="entropy threshold on H(p)/log k (normalized, see rfmem.py)")
    entropy_normalized: bool = Field(True, description="divide H(p) by log k so τ does not depend on k")

    # RF-Mem recollection (paper §2.2, Algorithm 3)
    beam: int = Field(3, ge=1, description="beam width B")
    fanout: int = Field(2, ge=1, description="fanout F; N = (B + r)·F")
    rounds: int = Field(3, ge=1, description="max rounds R")
    alpha: float = Field(0.5, ge=0.0, le=1.0, description="α: weight of the current query in the mix")
    kmeans_iters: int = 10
    full_exploration: bool = Field(False, description="run all R rounds (paper Appendix D.9)")
    rerank_union: bool = Field(False, description="re-rank the union by the original query (Appendix D.9)")

    # beyond the paper
    lexical_weight: float = Field(0.3, ge=0.0, le=1.0, description="share of BM25 in the hybrid score")
    bm25_k1: float = 1.2
    bm25_b: float = Field(0.9, ge=0.0, le=1.0, description="BM25 length normalization b: 0.9 rather than the "
                          "usual 0.75, so a long turn (an assistant reply of 4,000 characters) does not win on "
                          "containing many query words (BEAM +0.014/+0.025 R@10, LoCoMo -0.003)")
    kind_weights: dict[str, float] = Field(
        default_factory=lambda: {"message": 0.0, "fragment": 0.0, "insight": -0.1, "summary": -0.05,
                                 "topic": 0.0},
        description="additive score prior per memory kind (hybrid strategies)")
    dedupe_sources: bool = Field(True, description="the hybrid strategies and the walk skip memories whose "
                                 "every source message is already cited above them (so does the "
                                 "reranker after reordering their candidates)")
    assistant_speakers: tuple[str, ...] = Field(
        ("assistant",), description="speakers (case-insensitive) whose turns are searched as raw turns only: "
        "memories citing nothing but their turns (fragments, topics, insights of an assistant's replies) are "
        "not searched (strategies.assistant_memories); empty: search every memory. Consolidation reads it too: "
        "such fragments are capped per turn (extract), never compared (supersede) and not summarized; a "
        "change applies to what is consolidated after it")
    recall_boost: float = Field(0.1, ge=0.0, le=1.0, description="added to an assistant's raw turns in the hybrid "
                                "score when the query asks what the assistant said before (\"How did you "
                                "recommend ...?\", not \"Can you recommend ...?\"; retrieval.recall_cue); 0: off")
    own_words_penalty: float = Field(0.2, ge=0.0, le=1.0, description="taken from an assistant's raw turns in the "
                                     "hybrid score when the query asks what the user said (\"did I mention\", \"the "
                                     "order in which I brought up\"; retrieval.recall_cue); 0: off")
    turn_pool_gamma: float = Field(0.0, ge=0.0, description="with > 0 the deduplicating strategies rank a "
                                   "turn once with the single-source memories citing it (its fragments): "
                                   "s_turn + n^-γ·max(0, best member − s_turn) for n members (strategies."
                                   "pool_turns); 0: the plain max over them (off)")
    instruction_slots: int = Field(1, ge=0, description="places kept in a result for the user's standing "
                                   "instructions to an assistant (\"Always ... when I ask about ...\"): the best-matching "
                                   "ones no item cites yet, never all k places (retrieval.instructions); 0: off")
    instruction_min_score: float = Field(0.3, ge=-1.0, le=1.0, description="cosine an instruction needs with "
                                         "the query to take its place")
    instruction_rank: int = Field(4, ge=0, description="0-based place a pinned instruction takes (4: the fifth, "
                                  "below the four best memories); a shorter list gets it last")
    validity: bool = Field(True, description="a superseded memory the strategy returns is ranked right below "
                           "its current replacement (pulled in when missing), a contradicted one next to its "
                           "counterpart, and context() shows history and contradictions (retrieval.validity; "
                           "`mnemo bench updates` measures it)")
    calibration_samples: int = Field(256, ge=8, description="memories used as pseudo-queries to calibrate")
    calib_high_q: float = Field(0.75, ge=0.0, le=1.0, description="θ_high = this quantile of the store's probe means")
    calib_low_q: float = Field(0.25, ge=0.0, le=1.0, description="θ_low = this quantile of the store's probe means")
    calib_tau_q: float = Field(0.5, ge=0.0, le=1.0, description="τ = this quantile of the store's probe entropies")
    calib_shift: float = Field(0.0, description="subtracted from pseudo-query means (memory vs question gap)")

    # RMM retrospective reflection (Tan et al. §6, Appendix A.1): top-K = 20 -> top-M = 5
    rerank: bool = Field(False, description="apply the latest reranker version to every retrieve")
    rerank_top_k: int = Field(20, ge=1, le=200, description="candidates the reranker re-scores")
    rerank_top_m: int = Field(5, ge=1, le=200, description="items kept when rerank is on and no k is given")
    rerank_explore: bool = Field(False, description="sample the top-M with Gumbel noise (the paper's online "
                                 "exploration, starting from the identity when no version exists) instead of "
                                 "the argmax: feedback from deterministic top-M is what the reranker already "
                                 "shows, and REINFORCE on it learns to demote the base ranking")
    rerank_seed: int | None = Field(None, description="seed of the exploration noise (benchmarks)")
    rerank_scope: Literal["global", "user"] = Field("global", description="use the user's own version "
                                                   "when `user` (falling back to the global one)")
    # training (retrieval.rerank.TrainConfig; Appendix A.1 values by default)
    rerank_lr: float = Field(1e-3, gt=0, description="policy-gradient learning rate η (A.1: 1e-3)")
    rerank_batch_size: int = Field(4, ge=1, description="feedback rows per update (A.1: 4)")
    rerank_temperature: float = Field(0.5, gt=0, description="Gumbel / softmax temperature τ (A.1: 0.5)")
    rerank_baseline: float | Literal["mean"] = Field(0.5, description="REINFORCE baseline b (A.1: 0.5); "
                                                     "'mean': the mean reward of the feedback trained on")
    rerank_optimizer: Literal["sgd", "adam"] = Field("sgd", description="sgd: eq. 3 as written; adam "
                                                     "diverges with b = 0.5 (bench/RESULTS.md), not with "
                                                     "baseline 'mean'")
    rerank_epochs: int = Field(1, ge=1, description="passes over the new feedback per train run")
    rerank_samples: int = Field(0, ge=0, description="fresh Gumbel top-M samples per query per step over "
                                "the top-K pool (0: the logged shown list only)")
    rerank_rank: int = Field(0, ge=0, description="train W = U Vᵀ of this rank (0: full d×d)")
    rerank_l2: float = Field(0.0, ge=0, description="L2 pull of the residual adapters toward 0")
    rerank_clip: float = Field(0.0, ge=0, description="clip the batch gradient norm (0: off)")

    # caching and service
    refresh_ms: int = Field(500, ge=0, description="check table versions at most this often")
    max_query_chars: int = Field(4000, ge=1, description="longer queries are refused (HTTP 413)")
    max_k: int = 200
    context_tokens: int = Field(1500, ge=1, description="default token budget of res.context()")
    host: str = "127.0.0.1"
    port: int = Field(8765, ge=1, le=65535)
    api_key: ApiKey | None = Field(None, description="`MNEMO_API_KEY`: when set, /v1 calls "
                                      "need `Authorization: Bearer <key>`")
    # appends (memory.ingest.append, POST /v1/users/{user_id}/messages, the MCP append tool)
    append_max_messages: int = Field(1000, ge=1, description="most turns one append batch may carry "
                                     "(more: AppendTooLargeError, HTTP 413)")
    append_max_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="largest append request body in "
                                  "bytes (HTTP 413 while it streams)")
    append_compact_every: int = Field(100, ge=0, description="the service compacts the tables appends write "
                                      "(messages, sessions, quarantine) in the background after this many "
                                      "append batches (0: never; every batch adds a data file)")
    append_process: bool = Field(True, description="the service writes appends in a child process of its own "
                                 "(memory.ingest.append_worker: no interpreter lock shared with retrieval); "
                                 "off: in the serving process (always for memory:// stores)")
    append_nice: int = Field(5, ge=0, le=19, description="CPU niceness added to that child, so queries are "
                             "served first when the machine is busy (0: the server's priority)")
    write_wait_s: float = Field(2.0, ge=0, description="how long a write through the service (append, "
                                "feedback, forget) waits for the store's write lease before HTTP 503")

    def with_overrides(self, **overrides: Any) -> "RetrievalSettings":
        """A copy with the non-None overrides applied, validated (a value out of its field's range raises
        pydantic's ValidationError, as loading it from the environment would)."""
        clean = {k: v for k, v in overrides.items() if v is not None}
        return self.model_validate({**self.model_dump(), **clean})


class Settings(BaseModel):
    """Every knob of mnemo, with defaults that run on one laptop with no GPU and no network."""

    model_config = ConfigDict(extra="forbid")

    store: StoreUri = Field("./memstore", description="LanceDB directory or object-store URI")

    # embedder
    embedder: str = "sentence-transformers"
    embed_model: str = Field("", description="model name or path; empty = packaged all-MiniLM-L6-v2")
    embed_batch_size: int = Field(64, ge=1)
    embed_device: Annotated[str, AfterValidator(_known_device)] = Field("cpu", description="torch device: "
                                                                        "cpu, cuda, cuda:N, mps, xpu ...")
    embed_backend: Literal["torch", "onnx", "onnx-int8"] = Field(
        "torch", description="how the sentence-transformers model runs: torch, or ONNX Runtime on CPU (`onnx`, "
        "`onnx-int8` = int8 dynamic quantization), exported once from the local model into embed_cache_dir "
        "(memory/embed_onnx.py); vectors of different backends are recorded under different model names")
    embed_cache_dir: str = Field("~/.cache/mnemo", description="where exported embedder files are kept "
                                 "(`~` expanded); never inside the installed packages")

    # LLM
    llm: str = "rules"
    llm_model: str = Field("", description="model name for openai/vllm/replay; empty = backend default")
    llm_base_url: str = "http://127.0.0.1:8000/v1"
    llm_api_key: SecretStr | None = None
    llm_concurrency: int = Field(8, ge=1, description="requests one stage's batch keeps in flight (per shard: "
                                 "shards that run at once, in threads or Dask workers, each keep as many)")
    llm_timeout_s: float = Field(120.0, gt=0)
    llm_max_retries: int = Field(3, ge=0)
    llm_max_tokens: int = Field(2048, ge=1)
    llm_temperature: float = 0.0
    max_llm_attempts: int = Field(3, ge=1, description="runs that may try a quarantined piece of LLM work "
                                  "(a session's extraction or topics, a user's summaries) before it is given up")

    assistant_fragments_per_turn: int | None = Field(6, ge=0, description="fragments kept per assistant turn "
                                                     "(retrieval.assistant_speakers) among those citing only "
                                                     "assistant turns, the first extracted; None: all. Retrieval "
                                                     "never searches them; they feed topics and insights")

    extract_window_messages: int | None = Field(12, ge=1, description="messages per extraction request to a "
                                                "model (not `rules`): a longer session is split into windows "
                                                "of consecutive messages, so that what they say fits the "
                                                "answer's token limit (at MNEMO_LLM_MAX_TOKENS 2048 the decoded "
                                                "schema holds 18-24 items); None: one request per session")

    # PREMem linking
    theta: float = Field(0.6, description="centroid cosine above which clusters link (PREMem θ)")
    max_clusters: int = 8
    #: fragments per side of a linked pair that `reason` sees, the nearest its cluster's centroid: a
    #: pair's prompt (and the rules' pairwise checks) stay bounded however long the sessions are
    reason_max_fragments: int = Field(32, ge=2)

    # MemWeaver
    rebuild_graph: bool = Field(False, description="rebuild each user's graph and summaries from scratch")

    # RMM topics
    topic_merge_threshold: float = Field(0.75, ge=-1.0, le=1.0, description="cosine above which the `rules` "
                                         "backend merges a new topic into the most similar existing one")

    # compaction (memory.runs.compact, after a run that wrote: a backfill compacts every table written)
    compact_max_fragments: int = Field(16, ge=1, description="a consolidation compacts (Store.optimize) every "
                                       "table holding more data fragments than this")
    cleanup_older_than_s: float = Field(3600.0, ge=0, description="compaction deletes the files of table "
                                        "versions created longer ago than this (never the latest); a reader "
                                        "pinned to an older version than that fails, so keep it above the "
                                        "longest read")

    # orchestration
    shard_size: int = Field(8, ge=1)
    max_workers: int = Field(2, ge=1)
    task_runner: Literal["threads", "dask"] = "threads"
    dask_local: int = Field(0, ge=0, description="local Dask workers (0: no Dask)")
    dask_address: str | None = None

    # one writer per store (memory.lease)
    write_lease_wait_s: float = Field(30.0, ge=0, description="how long a write waits for the store's "
                                      "write lease held by another writer before StoreBusyError")
    run_lease_wait_s: float = Field(0.0, ge=0, description="how long a consolidation waits for a run "
                                    "still in progress on the store before it is skipped (exit 75)")
    lease_backend: Literal["auto", "file", "row"] = Field(
        "auto", description="how leases are held: `file` locks (local directories), `row` = a lease row with an "
        "expiry in the store, through Lance's conditional commit (spans hosts); `auto`: file for local "
        "directories, row for object-store URIs (memory.lease_row)")
    lease_ttl_s: float = Field(30.0, gt=0, description="lifetime of a lease row: a dead holder blocks other "
                               "writers at most this long (renewed every third of it while held)")

    # the online retriever and its service
    retrieval: RetrievalSettings = Field(default_factory=lambda: RetrievalSettings())

    def with_overrides(self, **overrides: Any) -> "Settings":
        """A copy with the non-None overrides applied (CLI flags win over the environment); a section
        given as a dict (a deployment's `{"retrieval": {"k": 5}}`) updates that section's fields only."""
        data = self.model_dump()
        for key, value in overrides.items():
            if value is None:
                continue
            data[key] = {**data[key], **value} if isinstance(value, dict) and isinstance(data.get(key), dict) else value
        return self.model_validate(data)


class _FromEnvironment(BaseSettings, Settings):
    """`Settings` read from `MNEMO_*` variables; nested sections split at their first underscore."""

    model_config = SettingsConfigDict(env_prefix="MNEMO_", extra="ignore", env_nested_delimiter="_",
                                      env_nested_max_split=1)

    api_key: ApiKey | None = Field(None, exclude=True)


#: `MNEMO_*` variables that are no setting (the deployment's: infra/prefect.yaml)
OTHER_VARIABLES = frozenset({"MNEMO_REPO_DIR"})


def _sections() -> dict[str, type[BaseModel]]:
    """The sections of `Settings` (`retrieval`): fields that are models of their own."""
    return {name: info.annotation for name, info in Settings.model_fields.items()
            if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)}


@lru_cache(maxsize=1)
def setting_variables() -> frozenset[str]:
    """Every `MNEMO_*` variable a setting reads: MNEMO_<FIELD>, MNEMO_<SECTION>_<FIELD>, MNEMO_API_KEY."""
    names = {"MNEMO_API_KEY"} | {f"MNEMO_{name.upper()}" for name in Settings.model_fields}
    for name, section in _sections().items():
        names |= {f"MNEMO_{name.upper()}_{sub.upper()}" for sub in section.model_fields}
    return frozenset(names)


def closest_variable(name: str) -> str | None:
    """The setting's variable closest to `name` (a typo's fix), if one is close."""
    return next(iter(difflib.get_close_matches(name.upper(), setting_variables(), n=1, cutoff=0.75)), None)


def unknown_variables(environ: Mapping[str, str]) -> dict[str, str | None]:
    """`MNEMO_*` variables of `environ` that no setting reads (a typo is otherwise silently ignored),
    each with `closest_variable`. A section's (`MNEMO_RETRIEVAL_*`) are left out: an unknown one
    there stops loading with a validation error (`extra="forbid"`), which names it."""
    known = setting_variables() | OTHER_VARIABLES
    sections = tuple(f"MNEMO_{name.upper()}_" for name in _sections())
    return {k: closest_variable(k) for k in sorted(environ)
            if k.upper().startswith("MNEMO_") and k.upper() not in known and not k.upper().startswith(sections)}


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment with the non-None `overrides` applied (CLI flags win); a
    `MNEMO_*` variable no setting reads is named in a warning.

    The one place mnemo reads its environment; call it at an edge and pass the result down."""
    for name, close in unknown_variables(os.environ).items():
        log.warning("%s is no mnemo setting and is ignored%s", name, f" (did you mean {close}?)" if close else "")
    env = _FromEnvironment()
    data = env.model_dump(exclude={"api_key"})
    if env.api_key is not None and data["retrieval"].get("api_key") is None:
        data["retrieval"]["api_key"] = env.api_key
    return Settings.model_validate(data).with_overrides(**overrides)
