"""RMM retrospective reflection (Tan et al. §6, Appendix A.1): a reranker trained from citations.

    q' = q + W_q q,   m'_i = m_i + W_m m_i,   s_i = q'·m'_i (+ prior_i)

`prior_i` is what the base strategy added to the cosine of candidate i (BM25, kind weights:
base score − q·m_i); it is 0 for `dense` / `familiarity`, where the score is the paper's exactly.
With W = 0 the reranker keeps the base order. Inference takes the top-M of the top-K (20 → 5) by
s_i; training is REINFORCE over Gumbel-perturbed softmax probabilities p = softmax((s + g) / τ):

    L = −Σ_{i ∈ shown} (R_i − b) log p_i,   R_i = +1 cited, −1 shown but not cited,  b = 0.5

with batch 4, τ = 0.5 and plain SGD (eq. 3) at learning rate 1e-3, in NumPy (the gradient is two
rank-one updates per example). Beyond the paper, selectable through the `rerank_*` settings: several
passes over the feedback, fresh Gumbel top-M samples of the current policy over the top-K pool
(`samples`), low-rank adapters W = U Vᵀ (`rank`), an L2 pull toward W = 0 (`l2`), gradient clipping
(`clip`) and Adam. On LoCoMo dev5 none of them moves held-back Recall@5 by more than noise (±0.015;
see `mnemo bench rerank`): ~380 simulated-citation queries with 9% of shown items cited do not
constrain 2·384² weights, and even with every top-20 candidate labelled the gain is ≈ +0.016. Weights are versioned in the `rerankers` table with the run's metrics; a
version whose bytes do not match its checksum or shape is skipped with a warning.
"""
from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Sequence

import numpy as np
import pyarrow.compute as pc
from lancedb.expr import col, lit

from memory import schemas
from memory.ids import make_id, validate_user_id
from memory.store import Store
from retrieval.strategies import novel_order

log = logging.getLogger(__name__)

GLOBAL = "global"
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def scope_key(scope: str, user_id: str | None = None) -> str:
    """"global" or "user:<id>" (the `scope` column)."""
    if scope == GLOBAL:
        return GLOBAL
    if scope == "user":
        return f"user:{validate_user_id(user_id)}"
    raise ValueError(f"unknown reranker scope {scope!r} (known: global, user)")


@dataclass(frozen=True)
class TrainConfig:
    """Appendix A.1 values; `epochs` passes over the new feedback (the paper trains online, one pass)."""

    lr: float = 1e-3
    batch_size: int = 4
    temperature: float = 0.5
    baseline: float | str = 0.5     # or "mean": the mean reward of the feedback trained on
    top_k: int = 20
    top_m: int = 5
    epochs: int = 1
    seed: int = 0
    optimizer: str = "sgd"          # eq. 3: Δφ = η (R − b) ∇ log P; "adam" is the alternative
    samples: int = 0                # Gumbel top-M samples per query per step from the current policy over the
                                    # top-K pool (0: the logged shown list only); unlogged items get R = b
    rank: int = 0                   # W = U Vᵀ of this rank (0: full d×d)
    l2: float = 0.0                 # pull of W (or U, V) toward 0: the adapters are residual
    clip: float = 0.0               # clip each batch gradient's Frobenius norm to this (0: off)

    @classmethod
    def from_settings(cls, s: Any, **overrides: Any) -> "TrainConfig":
        """The `rerank_*` fields of RetrievalSettings (non-None overrides win)."""
        cfg = cls(lr=s.rerank_lr, batch_size=s.rerank_batch_size, temperature=s.rerank_temperature,
                  baseline=s.rerank_baseline, top_k=s.rerank_top_k, top_m=s.rerank_top_m, epochs=s.rerank_epochs,
                  optimizer=s.rerank_optimizer, samples=s.rerank_samples, rank=s.rerank_rank, l2=s.rerank_l2,
                  clip=s.rerank_clip)
        return replace(cfg, **{k: v for k, v in overrides.items() if v is not None})


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
            raise ValueError(f"{arr.size} weights for a {dim}-d reranker (want {2 * dim * dim})")
        if not np.isfinite(arr).all():
            raise ValueError("non-finite weights")
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
    """The newest valid version of a scope and its row; corrupt versions are skipped with a warning."""
    for row in _rows(store, key):
        try:
            weights = store.read_ids("rerankers", [row["id"]], columns=["weights"]).column("weights")
            raw = row["weights"] = (weights[0].as_py() if len(weights) else None) or b""
            if hashlib.sha256(raw).hexdigest() != row["sha256"]:
                raise ValueError("checksum mismatch")
            if int(row["dim"] or 0) != store.dim:
                raise ValueError(f"{row['dim']}-d weights for a {store.dim}-d store")
            return Reranker.from_bytes(raw, store.dim, version=int(row["version"]), scope=key), row
        except Exception as exc:
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
    `refresh_ms`)."""

    def __init__(self, store: Store, refresh_ms: int = 500) -> None:
        self.store = store
        self.refresh_s = refresh_ms / 1000.0
        self._models: dict[str, Reranker | None] = {}
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
                    self._version, self._models = v, {}
            if key not in self._models:
                self._models[key] = load_latest(self.store, key)[0]
            return self._models[key]


# -- training ---------------------------------------------------------------------------------------
@dataclass
class Example:
    """One logged query: candidate vectors (K, d), their prior, the shown positions and rewards."""

    q: np.ndarray
    m: np.ndarray
    prior: np.ndarray
    shown: np.ndarray
    reward: np.ndarray
    #: each candidate's source ids when the base strategy deduplicates (`Query.deduped`): a candidate
    #: whose sources the items shown before it all cite could not have been shown after them
    sources: list[list[str]] | None = None


def _uncovered(ex: Example, remaining: np.ndarray, seen: set[str]) -> None:
    """Drop from `remaining` the candidates whose every source is in `seen` (deduplicated lists)."""
    assert ex.sources is not None
    for j in np.flatnonzero(remaining).tolist():
        src = ex.sources[j]
        if src and set(src) <= seen:
            remaining[j] = False


def _pl_grad(model: Reranker, ex: Example, shown: Sequence[int], adv: np.ndarray,
             cfg: TrainConfig) -> tuple[float, np.ndarray, np.ndarray]:
    """−Σ_k adv_k log P(shown_k | shown_<k) under Plackett-Luce over softmax(s / τ) and its gradients."""
    qp = ex.q + model.wq @ ex.q
    mp = ex.m + ex.m @ model.wm.T
    z = (mp @ qp + ex.prior) / cfg.temperature
    remaining = np.ones(z.shape[0], dtype=bool)
    seen: set[str] = set()
    g = np.zeros_like(z)
    loss = 0.0
    for pos, a in zip(shown, adv):
        if a != 0.0:
            zr = np.where(remaining, z, -np.inf)
            top = zr.max()
            p = np.exp(zr - top)
            tot = p.sum()
            p /= tot
            loss -= a * (z[pos] - top - np.log(tot))
            g += a * p                  # d(-a log p_pos)/dz = -a (onehot - p)
            g[pos] -= a
        remaining[pos] = False
        if ex.sources is not None:
            seen |= set(ex.sources[pos] or [])
            _uncovered(ex, remaining, seen)
    g /= cfg.temperature                # dL/ds
    g_wq = np.outer(mp.T @ g, ex.q)
    g_wm = np.outer(qp, ex.m.T @ g)
    return float(loss), g_wq, g_wm


def _loss_grad(model: Reranker, ex: Example, cfg: TrainConfig,
               rng: np.random.Generator | None = None) -> tuple[float, np.ndarray, np.ndarray]:
    """REINFORCE loss and gradients for one logged query.

    The shown items are the policy's sample without replacement, in order (Plackett-Luce over
    softmax(s / τ), which Gumbel-top-M sampling draws from), so
    log P(shown) = Σ_k z_{i_k} − log Σ_{j not yet shown} exp(z_j), z = s / τ, and each step is
    weighted by its own item's advantage R − b. For a deduplicating base strategy (`ex.sources`)
    the candidates covered by the items shown so far leave the sum too, as they left the sample.

    With `cfg.samples` = S > 0 the lists are instead S fresh Gumbel top-M samples of the current
    policy over the whole top-K pool (the paper's online sampling, replayed): a sampled item that was
    shown keeps its logged reward, one never shown has no known reward and gets R = b (no push)."""
    adv = ex.reward - cfg.baseline
    if cfg.samples <= 0 or rng is None:
        return _pl_grad(model, ex, ex.shown, adv, cfg)
    known = np.zeros(ex.m.shape[0])
    known[ex.shown] = adv
    loss, gq, gm = 0.0, 0.0, 0.0
    for _ in range(cfg.samples):
        order, _ = model.sample(ex.q, ex.m, ex.prior, ex.m.shape[0], rng, cfg.temperature)
        if ex.sources is not None:
            order = novel_order(ex.sources, order, cfg.top_m)
        order = order[:cfg.top_m]
        l, a, b = _pl_grad(model, ex, order, known[order], cfg)
        loss, gq, gm = loss + l / cfg.samples, gq + a / cfg.samples, gm + b / cfg.samples
    return loss, np.asarray(gq), np.asarray(gm)


def cited_in_top(model: Reranker, examples: Sequence[Example], top_m: int) -> float:
    """Share of cited candidates the model ranks in its top-M (deterministic, no noise)."""
    hit = total = 0
    for ex in examples:
        cited = set(ex.shown[ex.reward > 0].tolist())
        if not cited:
            continue
        order, _ = model.rerank(ex.q, ex.m, ex.prior, top_m)
        hit += len(cited & set(order.tolist()))
        total += len(cited)
    return hit / total if total else float("nan")


def resolve_baseline(baseline: float | str, examples: Sequence[Example]) -> float:
    """The REINFORCE baseline b as a number: "mean" is the mean reward over the examples' shown items.

    A.1's b = 0.5 suits a high cited share; at LoCoMo's ~9 % nearly every advantage is −1.5, which
    pushes the shown (base-ranked) items below the unshown ones (Adam: −0.41 Recall@5)."""
    if isinstance(baseline, (int, float)):
        return float(baseline)
    if baseline != "mean":
        raise ValueError(f"unknown reranker baseline {baseline!r} (a number or 'mean')")
    rewards = np.concatenate([ex.reward for ex in examples]) if examples else np.zeros(0)
    return float(rewards.mean()) if rewards.size else 0.0


def train(examples: Sequence[Example], dim: int, init: Reranker | None = None,
          cfg: TrainConfig = TrainConfig()) -> tuple[Reranker, dict[str, Any]]:
    """REINFORCE (SGD, eq. 3, or Adam) over the examples in batches; returns the new model and metrics.

    With `cfg.rank` = r > 0 each adapter is trained as W = U Vᵀ (U, V: d×r; V starts at 0, U small
    random, or the truncated SVD of `init`), 2·2·d·r parameters instead of 2·d²; the stored weights are
    the products, so inference and storage do not change. `cfg.l2` adds λ‖·‖² on the trained
    parameters, `cfg.clip` caps the batch gradient's norm."""
    model = Reranker(init.wq.copy(), init.wm.copy()) if init is not None else Reranker.identity(dim)
    rng = np.random.default_rng(cfg.seed)
    cfg = replace(cfg, baseline=resolve_baseline(cfg.baseline, examples))
    before = cited_in_top(model, examples, cfg.top_m)
    params: dict[str, np.ndarray] = {}
    if cfg.rank > 0:
        for name in ("wq", "wm"):
            w = getattr(model, name).astype(np.float64)
            if np.any(w):
                u, sv, vt = np.linalg.svd(w)
                params[name + ".u"] = u[:, :cfg.rank] * np.sqrt(sv[:cfg.rank])
                params[name + ".v"] = vt[:cfg.rank].T * np.sqrt(sv[:cfg.rank])
            else:
                params[name + ".u"] = rng.standard_normal((dim, cfg.rank)) / np.sqrt(dim)
                params[name + ".v"] = np.zeros((dim, cfg.rank))
            setattr(model, name, (params[name + ".u"] @ params[name + ".v"].T).astype(np.float32))
    else:
        params = {"wq": model.wq.astype(np.float64), "wm": model.wm.astype(np.float64)}
    state = {n: (np.zeros_like(v), np.zeros_like(v)) for n, v in params.items()}
    b1, b2, eps, step = 0.9, 0.999, 1e-8, 0
    losses: list[float] = []
    start = time.perf_counter()
    for _ in range(cfg.epochs):
        order = rng.permutation(len(examples))
        for i in range(0, len(order), cfg.batch_size):
            batch = [examples[j] for j in order[i:i + cfg.batch_size]]
            gq = np.zeros((dim, dim))
            gm = np.zeros((dim, dim))
            bl = 0.0
            for ex in batch:
                loss, a, b = _loss_grad(model, ex, cfg, rng)
                gq += a / len(batch)
                gm += b / len(batch)
                bl += loss / len(batch)
            losses.append(bl)
            step += 1
            full = {"wq": gq, "wm": gm}
            if cfg.rank > 0:        # dL/dU = G V, dL/dV = Gᵀ U
                grads = {}
                for name, g in full.items():
                    grads[name + ".u"] = g @ params[name + ".v"]
                    grads[name + ".v"] = g.T @ params[name + ".u"]
            else:
                grads = full
            if cfg.l2 > 0:
                grads = {n: g + 2 * cfg.l2 * params[n] for n, g in grads.items()}
            if cfg.clip > 0:
                norm = np.sqrt(sum(float((g * g).sum()) for g in grads.values()))
                if norm > cfg.clip:
                    grads = {n: g * (cfg.clip / norm) for n, g in grads.items()}
            for name, grad in grads.items():
                if cfg.optimizer == "sgd":
                    params[name] -= cfg.lr * grad
                    continue
                m1, m2 = state[name]
                m1 *= b1
                m1 += (1 - b1) * grad
                m2 *= b2
                m2 += (1 - b2) * grad * grad
                params[name] -= cfg.lr * (m1 / (1 - b1 ** step)) / (np.sqrt(m2 / (1 - b2 ** step)) + eps)
            for name in ("wq", "wm"):
                w = params[name] if cfg.rank <= 0 else params[name + ".u"] @ params[name + ".v"].T
                setattr(model, name, w.astype(np.float32))
    rewards = np.concatenate([ex.reward for ex in examples]) if examples else np.zeros(0)
    metrics = {
        "examples": len(examples), "steps": step, "epochs": cfg.epochs, "config": asdict(cfg),
        "cited_share": float((rewards > 0).mean()) if rewards.size else float("nan"),
        "loss_first": float(np.mean(losses[:25])) if losses else float("nan"),
        "loss_last": float(np.mean(losses[-25:])) if losses else float("nan"),
        "cited_in_top_m_before": before, "cited_in_top_m_after": cited_in_top(model, examples, cfg.top_m),
        "seconds": round(time.perf_counter() - start, 3),
    }
    return model, metrics


def candidates(retriever: Any, user_id: str, qvec: np.ndarray, text: str | None,
               top_k: int, strategy: str | None = None
               ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, list[list[str]] | None]:
    """The base strategy's top-K for a query: ids, vectors (K, d), prior (base − cosine), rows, and
    the source ids of each when the strategy deduplicates sources (else None)."""
    index = retriever.user_index(user_id)
    res = retriever.retrieve(user_id, qvec, k=min(top_k, retriever.settings.max_k), strategy=strategy,
                             text=text, rerank=False)
    pos = index.row_of_id()
    rows = np.asarray([pos[it.id] for it in res.items], dtype=np.int64)
    m = index.z[rows]
    base = np.asarray([it.score for it in res.items], dtype=np.float32)
    sources = [list(it.source_ids) for it in res.items] if res.deduped else None
    return [it.id for it in res.items], m, base - m @ qvec, rows, sources


def examples_from_feedback(retriever: Any, rows: Sequence[dict[str, Any]], cfg: TrainConfig,
                           strategy: str | None = None) -> list[Example]:
    """Rebuild each logged query's candidate set with the base strategy (shown items that fell out of
    it are appended with prior 0; ids no longer stored are dropped)."""
    out = []
    for r in rows:
        user = r["user_id"]
        qvec = r.get("query_vector")
        qvec = retriever.embed([r["query"]])[0] if qvec is None else np.asarray(qvec, dtype=np.float32)
        ids, m, prior, _, sources = candidates(retriever, user, qvec, r["query"], cfg.top_k, strategy)
        pos = {v: i for i, v in enumerate(ids)}
        extra = [s for s in r["shown_ids"] if s not in pos]
        if extra:
            index = retriever.user_index(user)
            where = index.row_of_id()
            extra = [s for s in extra if s in where]
            if extra:
                m = np.concatenate([m, index.z[[where[s] for s in extra]]])
                prior = np.concatenate([prior, np.zeros(len(extra), np.float32)])
                if sources is not None:
                    src = index.meta.column("source_ids").take([where[s] for s in extra]).to_pylist()
                    sources = sources + [list(x or []) for x in src]
                for s in extra:
                    pos[s] = len(pos)
        shown = [pos[s] for s in r["shown_ids"] if s in pos]
        if not shown:
            continue
        cited = set(r["cited_ids"] or [])
        reward = np.asarray([1.0 if s in cited else -1.0 for s in r["shown_ids"] if s in pos])
        out.append(Example(qvec, m, prior.astype(np.float32), np.asarray(shown), reward, sources))
    return out


@dataclass
class TrainReport:
    scope: str
    version: int | None
    feedback: int
    metrics: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None

    def summary(self) -> str:
        if self.skipped:
            return f"reranker {self.scope}: skipped ({self.skipped})"
        m = self.metrics
        return (f"reranker {self.scope} v{self.version}: {self.feedback} feedback rows, {m.get('steps')} steps, "
                f"cited in top-{m.get('config', {}).get('top_m')} {m.get('cited_in_top_m_before', 0):.3f} -> "
                f"{m.get('cited_in_top_m_after', 0):.3f}, {m.get('seconds')}s")


def train_reranker(retriever: Any, *, scope: str = GLOBAL, cfg: TrainConfig | None = None,
                   run_id: str = "", strategy: str | None = None) -> list[TrainReport]:
    """Train the next version of the global reranker (or of each user's, scope="user") from the
    feedback newer than the latest version; a scope with no new feedback is skipped."""
    from retrieval.feedback import read_feedback

    cfg = cfg or TrainConfig.from_settings(retriever.settings)
    store = retriever.store
    reports = []
    if scope == GLOBAL:
        groups = {GLOBAL: None}
    else:
        users = sorted(set(read_feedback(store, columns=["user_id"]).column("user_id").to_pylist()))
        groups = {scope_key("user", u): u for u in users}
    start = load_latest(store, GLOBAL)[0] if scope != GLOBAL else None   # a user's first version starts here
    for key, user in groups.items():
        init, row = load_latest(store, key)
        if init is None and key != GLOBAL:
            init = start
        since = row["feedback_until"] if row is not None else EPOCH
        t = read_feedback(store, user)
        if t.num_rows:
            t = t.filter(pc.greater(t.column("created_at"), since))
        if t.num_rows == 0:
            reports.append(TrainReport(key, None, 0, skipped="no new feedback"))
            continue
        rows = t.to_pylist()
        examples = examples_from_feedback(retriever, rows, cfg, strategy)
        model, metrics = train(examples, store.dim, init, cfg)
        metrics["from_version"] = init.version if init is not None else 0
        if not (np.isfinite(model.wq).all() and np.isfinite(model.wm).all()):
            log.error("reranker %s diverged on %d feedback rows; no version written", key, len(rows))
            reports.append(TrainReport(key, None, len(rows), metrics, skipped="diverged"))
            continue
        until = max(r["created_at"] for r in rows)
        version = save_version(store, model, key, feedback_until=until, metrics=metrics, run_id=run_id)
        reports.append(TrainReport(key, version, len(rows), metrics))
        log.info("%s", reports[-1].summary())
    return reports
