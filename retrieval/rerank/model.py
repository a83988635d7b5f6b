"""The online side of the RMM reranker (Tan et al. §6, Appendix A.1): the adapters, their stored
versions and the per-process cache the retriever reads them through.

    q' = q + W_q q,   m'_i = m_i + W_m m_i,   s_i = q'·m'_i (+ prior_i)

`prior_i` is what the base strategy added to the cosine of candidate i (BM25, kind weights:
base score − q·m_i); it is 0 for `dense` / `familiarity`, where the score is the paper's exactly.
With W = 0 the reranker keeps the base order. Inference takes the top-M of the top-K (20 → 5) by
s_i. Weights are versioned per scope ("global" or "user:<id>") in the `rerankers` table with the
training run's metrics; a version whose bytes do not match its checksum or shape is skipped with
a warning. The trainer is `retrieval.rerank.train`.
"""
from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np
from lancedb.expr import col, lit

from memory import schemas
from memory.errors import ConfigError, CorruptWeightsError
from memory.ids import make_id, validate_user_id
from memory.store import Store

log = logging.getLogger(__name__)

GLOBAL = "global"


def scope_key(scope: str, user_id: str | None = None) -> str:
    """"global" or "user:<id>" (the `scope` column)."""
    if scope == GLOBAL:
        return GLOBAL
    if scope == "user":
        return f"user:{validate_user_id(user_id)}"
    raise ConfigError(f"unknown reranker scope {scope!r} (known: global, user)", scope=scope)


@dataclass
class Reranker:
    """One version of the adapters."""

    wq: np.ndarray
    wm: np.ndarray
    version: int = 0
    scope: str = GLOBAL

    @classmethod
    def identity(cls, dim: int) -> "Reranker":
        return cls(np.zeros((dim, dim), np.float32), np.zeros((dim, dim), np.float32))

    @property
    def dim(self) -> int:
        return int(self.wq.shape[0])

    def scores(self, q: np.ndarray, m: np.ndarray, prior: np.ndarray | None = None) -> np.ndarray:
        qp = q + self.wq @ q
        s = m @ (qp + self.wm.T @ qp)     # = (m + m W_mᵀ) q': two mat-vecs instead of a (K×d)(d×d) product
        return s if prior is None else s + prior

    def rerank(self, q: np.ndarray, m: np.ndarray, prior: np.ndarray | None, top_m: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions of the top-M candidates by adapted score (stable on ties) and their scores."""
        s = self.scores(q, m, prior)
        order = np.argsort(-s, kind="stable")[:top_m]
        return order, s[order]

    def sample(self, q: np.ndarray, m: np.ndarray, prior: np.ndarray | None, top_m: int,
               rng: np.random.Generator, temperature: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
        """Top-M of the Gumbel-perturbed scores s_i / τ + g_i: a sample without replacement from the
        policy softmax(s / τ) (the Gumbel trick, paper eq. 2), the online exploration REINFORCE
        learns from."""
        s = self.scores(q, m, prior)
        g = -np.log(-np.log(rng.uniform(1e-10, 1.0, size=s.shape)))
        order = np.argsort(-(s / temperature + g), kind="stable")[:top_m]
        return order, s[order]

    def to_bytes(self) -> bytes:
        return np.concatenate([self.wq.ravel(), self.wm.ravel()]).astype("<f4").tobytes()

    @classmethod
    def from_bytes(cls, raw: bytes, dim: int, *, version: int = 0, scope: str = GLOBAL) -> "Reranker":
        arr = np.frombuffer(raw, dtype="<f4")
        if arr.size != 2 * dim * dim:
            raise CorruptWeightsError(f"{arr.size} weights for a {dim}-d reranker (want {2 * dim * dim})",
                                      size=int(arr.size), dim=dim)
        if not np.isfinite(arr).all():
            raise CorruptWeightsError("non-finite weights", dim=dim)
        wq = arr[: dim * dim].reshape(dim, dim).astype(np.float32)
        wm = arr[dim * dim:].reshape(dim, dim).astype(np.float32)
        return cls(wq, wm, version=version, scope=scope)


# -- storage ----------------------------------------------------------------------------------------
#: the `rerankers` columns but the weights blob (2·d² floats, 1.2 MB at d = 384): read one version's
#: weights only when it is the one loaded (the dimension does not change the names)
_META = [name for name in schemas.rerankers(1).names if name != "weights"]


def _rows(store: Store, key: str, columns: list[str] | None = None) -> list[dict[str, Any]]:
    """The versions of a scope, newest first, without their weights."""
    if not store.has_table("rerankers"):
        return []
    t = store.read("rerankers", where=col("scope") == lit(key), columns=columns or _META)
    return sorted(t.to_pylist(), key=lambda r: -int(r["version"] or 0))


def load_latest(store: Store, key: str = GLOBAL) -> tuple[Reranker | None, dict[str, Any] | None]:
    """The newest valid version of a scope and its row; a version that cannot be read or fails its
    checks is skipped with a warning."""
    for row in _rows(store, key):
        try:
            weights = store.read_ids("rerankers", [row["id"]], columns=["weights"]).column("weights")
            raw = row["weights"] = (weights[0].as_py() if len(weights) else None) or b""
            if hashlib.sha256(raw).hexdigest() != row["sha256"]:
                raise CorruptWeightsError("checksum mismatch", version=row["version"])
            if int(row["dim"] or 0) != store.dim:
                raise CorruptWeightsError(f"{row['dim']}-d weights for a {store.dim}-d store",
                                          version=row["version"])
            return Reranker.from_bytes(raw, store.dim, version=int(row["version"]), scope=key), row
        except Exception as exc:   # any unreadable version, not only a corrupt one: fall back to the previous
            log.warning("ignoring reranker %s version %s: %s", key, row.get("version"), exc)
    return None, None


def save_version(store: Store, model: Reranker, key: str, *, feedback_until: datetime,
                 metrics: dict[str, Any], run_id: str = "") -> int:
    """Write the next version of a scope; returns its number."""
    rows = _rows(store, key, columns=["version"])
    version = (int(rows[0]["version"]) if rows else 0) + 1
    raw = model.to_bytes()
    user = key.split(":", 1)[1] if key.startswith("user:") else None
    store.upsert("rerankers", [{
        "id": make_id("reranker", key, version), "version": version, "scope": key, "user_id": user,
        "created_at": datetime.now(timezone.utc), "dim": model.dim, "weights": raw,
        "sha256": hashlib.sha256(raw).hexdigest(), "feedback_until": feedback_until,
        "metrics_json": json.dumps(metrics, sort_keys=True), "run_id": run_id}])
    return version


class RerankerCache:
    """The latest version per scope, re-read when the `rerankers` table moved (checked at most every
    `refresh_ms`); at most `max_scopes` scopes are held, least recently used dropped first, so a stream
    of user ids cannot grow it without bound (a user's weights are dim² floats)."""

    def __init__(self, store: Store, refresh_ms: int = 500, max_scopes: int = 128) -> None:
        self.store = store
        self.refresh_s = refresh_ms / 1000.0
        self.max_scopes = max_scopes
        self._models: OrderedDict[str, Reranker | None] = OrderedDict()
        self._version = -1
        self._checked = 0.0
        self._lock = threading.Lock()

    def get(self, key: str) -> Reranker | None:
        now = time.monotonic()
        with self._lock:
            if now - self._checked >= self.refresh_s or self._version < 0:
                self._checked = now
                v = self.store.version("rerankers")
                if v != self._version:
                    self._version = v
                    self._models.clear()
            if key in self._models:
                self._models.move_to_end(key)
                return self._models[key]
            model = self._models[key] = load_latest(self.store, key)[0]
            while len(self._models) > self.max_scopes:
                self._models.popitem(last=False)
            return model

    def __len__(self) -> int:
        """Scopes held now."""
        return len(self._models)
