"""The offline side of the RMM reranker (Tan et al. §6, Appendix A.1): REINFORCE from citation
feedback, run by the nightly `train` task or `mnemo train-reranker`.

Training is REINFORCE over Gumbel-perturbed softmax probabilities p = softmax((s + g) / τ):

    L = −Σ_{i ∈ shown} (R_i − b) log p_i,   R_i = +1 cited, −1 shown but not cited,  b = 0.5

with batch 4, τ = 0.5 and plain SGD (eq. 3) at learning rate 1e-3, in NumPy (the gradient is two
rank-one updates per example). Beyond the paper, selectable through the `rerank_*` settings: several
passes over the feedback, fresh Gumbel top-M samples of the current policy over the top-K pool
(`samples`), low-rank adapters W = U Vᵀ (`rank`), an L2 pull toward W = 0 (`l2`), gradient clipping
(`clip`), Adam and a baseline b equal to the mean reward (`baseline="mean"`). What each does to
held-back Recall is measured by `mnemo bench rerank` (bench/RESULTS.md). A trained model is stored
as the next version of its scope (`retrieval.rerank.model.save_version`); the examples come from
`retrieval.rerank.examples`.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Sequence

import numpy as np
import pyarrow.compute as pc

from memory.errors import ConfigError
from memory.settings import RetrievalSettings
from retrieval.feedback import read_feedback
from retrieval.rerank.examples import BaseRetriever, Example, examples_from_feedback
from retrieval.rerank.model import GLOBAL, Reranker, load_latest, save_version, scope_key
from retrieval.strategies import novel_order

log = logging.getLogger(__name__)

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


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

    def __post_init__(self) -> None:
        if self.epochs < 1:   # zero passes would save the untrained weights as a version, consuming the feedback
            raise ConfigError(f"epochs must be at least 1, got {self.epochs}", epochs=self.epochs)

    @classmethod
    def from_settings(cls, s: RetrievalSettings, **overrides: Any) -> "TrainConfig":
        """The `rerank_*` fields of RetrievalSettings (non-None overrides win)."""
        cfg = cls(lr=s.rerank_lr, batch_size=s.rerank_batch_size, temperature=s.rerank_temperature,
                  baseline=s.rerank_baseline, top_k=s.rerank_top_k, top_m=s.rerank_top_m, epochs=s.rerank_epochs,
                  optimizer=s.rerank_optimizer, samples=s.rerank_samples, rank=s.rerank_rank, l2=s.rerank_l2,
                  clip=s.rerank_clip)
        return replace(cfg, **{k: v for k, v in overrides.items() if v is not None})


def _uncovered(ex: Example, remaining: np.ndarray, seen: set[str]) -> None:
    """Drop from `remaining` the candidates whose every source is in `seen` (deduplicated lists)."""
    assert ex.sources is not None
    for j in np.flatnonzero(remaining).tolist():
        src = ex.sources[j]
        if src and set(src) <= seen:
            remaining[j] = False


def pl_grad(model: Reranker, ex: Example, shown: Sequence[int] | np.ndarray, adv: np.ndarray,
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


def loss_grad(model: Reranker, ex: Example, cfg: TrainConfig,
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
        return pl_grad(model, ex, ex.shown, adv, cfg)
    known = np.zeros(ex.m.shape[0])
    known[ex.shown] = adv
    loss = 0.0
    gq: float | np.ndarray = 0.0
    gm: float | np.ndarray = 0.0
    for _ in range(cfg.samples):
        order, _ = model.sample(ex.q, ex.m, ex.prior, ex.m.shape[0], rng, cfg.temperature)
        if ex.sources is not None:
            order = novel_order(ex.sources, order, cfg.top_m)
        order = order[:cfg.top_m]
        l, a, b = pl_grad(model, ex, order, known[order], cfg)
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

    A.1's b = 0.5 suits a high cited share; at a low one nearly every advantage is −1.5, which
    pushes the shown (base-ranked) items below the unshown ones."""
    if isinstance(baseline, (int, float)):
        return float(baseline)
    if baseline != "mean":
        raise ConfigError(f"unknown reranker baseline {baseline!r} (a number or 'mean')", baseline=baseline)
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
                loss, a, b = loss_grad(model, ex, cfg, rng)
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


@dataclass
class TrainReport:
    """What one scope's training did: the version written (None when skipped), the feedback rows
    trained on and the run's metrics."""

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


def train_step(retriever: BaseRetriever, *, scope: str, run_id: str,
               users: Sequence[str] | None = None) -> list[str]:
    """The train step after a consolidation (the flow's `train` task, `mnemo consolidate --engine
    local`): `train_reranker` when the store holds feedback; one summary line per scope."""
    if not retriever.store.has_table("feedback"):
        return ["reranker: skipped (no feedback)"]
    return [rep.summary() for rep in train_reranker(retriever, scope=scope, run_id=run_id, users=users)]


def train_reranker(retriever: BaseRetriever, *, scope: str = GLOBAL, cfg: TrainConfig | None = None,
                   run_id: str = "", strategy: str | None = None,
                   users: Sequence[str] | None = None) -> list[TrainReport]:
    """Train the next version of the global reranker (or of each user's, scope="user") from the
    feedback newer than the latest version; a scope with no new feedback, or none citing a memory, is
    skipped, and a version that ranks the cited memories lower than the one before (or diverged) is
    not written: each nightly version starts from the last, so a bad one would compound. `users`
    (a run of some users, `--users`): only their own versions; the global one, trained on everyone's
    feedback, is then skipped (the next run over every user trains it)."""
    cfg = cfg or TrainConfig.from_settings(retriever.settings)
    store = retriever.store
    reports = []
    if scope == GLOBAL and users:
        return [TrainReport(GLOBAL, None, 0, skipped="a run of some users (--users) trains only user scopes")]
    if scope == GLOBAL:
        groups = {GLOBAL: None}
    else:
        have = sorted(set(read_feedback(store, columns=["user_id"]).column("user_id").to_pylist()))
        groups = {scope_key("user", u): u for u in have if not users or u in users}
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
        if not any(r["cited_ids"] for r in rows):   # every advantage -1.5: it would only demote the shown
            reports.append(TrainReport(key, None, len(rows), skipped="no cited memory in the new feedback"))
            continue
        examples = examples_from_feedback(retriever, rows, cfg.top_k, strategy)
        model, metrics = train(examples, store.dim, init, cfg)
        metrics["from_version"] = init.version if init is not None else 0
        if not (np.isfinite(model.wq).all() and np.isfinite(model.wm).all()):
            log.error("reranker %s diverged on %d feedback rows; no version written", key, len(rows))
            reports.append(TrainReport(key, None, len(rows), metrics, skipped="diverged"))
            continue
        before, after = metrics["cited_in_top_m_before"], metrics["cited_in_top_m_after"]
        if not np.isfinite(after) or (np.isfinite(before) and after < before):
            log.warning("reranker %s would rank the cited memories lower (%.3f -> %.3f); no version written",
                        key, before, after)
            reports.append(TrainReport(key, None, len(rows), metrics, skipped=f"cited in top-{cfg.top_m} would "
                                       f"fall {before:.3f} -> {after:.3f}"))
            continue
        until = max(r["created_at"] for r in rows)
        version = save_version(store, model, key, feedback_until=until, metrics=metrics, run_id=run_id)
        reports.append(TrainReport(key, version, len(rows), metrics))
        log.info("%s", reports[-1].summary())
    return reports
