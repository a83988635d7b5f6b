"""`mnemo bench beam-anchors`: BEAM's raw-message anchors (`ANCHORS.md`: dense top-K, BM25 and their
reciprocal-rank fusion over every message of a chat, no mnemo) computed in the project, on the text
the `beam` reader stores (the `->-> i,j` index markers stripped) or, with `keep_markers`, on the
content as published, which is what `ANCHORS.md` was measured on.

Why: the per-ability floors of the BEAM targets are the dense anchor's figures, and the markers move
them (a marker is text the embedder reads: at 100K information extraction is 0.875 with them and
0.825 without). Recall@K is `mnemo bench beam`'s (evidence Recall@K over the questions with evidence,
per ability); update-first, unlike that bench's (judged within the top K), compares the first updated
and the first original message in the whole ranking, as ANCHORS.md does (printed as ANCHORS.md
defines it, and beside it over the decidable questions: one whose updated message is also an original
one can never be first, `evaluation.beam.undecidable`). The messages are the ones
the `beam` reader stores (`read_beam`: a malformed message is left out as it would be quarantined).
The embedder is the configured one (`MNEMO_EMBED_*`; the report names it): the anchors used the
packaged all-MiniLM-L6-v2 on torch, the default. BM25 is ANCHORS.md's, not the project's `retrieval.lexical` (which drops stop words and
folds plurals): every lower-cased word token, k1 1.2, b 0.75, idf = ln(1 + (N − df + 0.5) /
(df + 0.5)) (never negative), a query word counted as often as the query says it. With `keep_markers` every dense and BM25 figure of `ANCHORS.md` is reproduced, and
the fused ones at 100K (at 500K fused R@10 is 0.515 against 0.526: how that fusion cut its candidate
lists is not documented).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from scipy import sparse
from sklearn.feature_extraction.text import CountVectorizer

from evaluation.beam import KS, load_questions, requested_scales, scale_chats, undecidable
from evaluation.beam_report import short
from memory.embed import embedder_for
from memory.errors import ConfigError
from memory.ingest.beam import beam_user, read_beam
from memory.settings import Settings

METHODS = ("dense", "bm25", "rrf")
#: reciprocal-rank fusion constant of ANCHORS.md
RRF_K = 60


class Okapi:
    """Okapi BM25 over word tokens (scikit-learn's counts): ANCHORS.md's lexical channel."""

    def __init__(self, texts: Sequence[str], k1: float = 1.2, b: float = 0.75) -> None:
        self.vectorizer = CountVectorizer(lowercase=True, token_pattern=r"(?u)\b\w+\b")
        tf = self.vectorizer.fit_transform(texts).tocoo()
        n = tf.shape[0]
        df = np.bincount(tf.col, minlength=tf.shape[1])
        idf = np.log1p((n - df + 0.5) / (df + 0.5))
        length = np.bincount(tf.row, weights=tf.data, minlength=n)
        norm = k1 * (1 - b + b * length / max(float(length.mean()), 1e-9))
        w = idf[tf.col] * tf.data * (k1 + 1) / (tf.data + norm[tf.row])
        self.weights = sparse.csc_matrix((w, (tf.row, tf.col)), shape=tf.shape)
        self.analyze = self.vectorizer.build_analyzer()

    def scores(self, query: str) -> np.ndarray:
        """Every text's score for `query`."""
        vocabulary = self.vectorizer.vocabulary_
        cols = [vocabulary[t] for t in self.analyze(query) if t in vocabulary]
        if not cols:
            return np.zeros(self.weights.shape[0])
        return np.asarray(self.weights[:, cols].sum(axis=1)).ravel()


def chat_messages(chat: Path, keep_markers: bool = False) -> tuple[list[str], list[str]]:
    """(message ids, texts) of the messages the `beam` reader stores from one `chat.json`, in order:
    its text (markers stripped), or with `keep_markers` the content as published."""
    ids, texts = [], []
    for kind, row in read_beam(chat, user_id="anchors"):
        if kind == "msg":
            ids.append(row["message_id"])
            texts.append(json.loads(row["raw"])["content"] if keep_markers else row["text"])
    return ids, texts


def rankings(query_vec: np.ndarray, query: str, vectors: np.ndarray, bm25: Okapi) -> dict[str, np.ndarray]:
    """Message indices per method, best first (ties broken by message order)."""
    dense = np.argsort(-(vectors @ query_vec), kind="stable")
    lexical = np.argsort(-bm25.scores(query), kind="stable")
    rank = np.empty((2, dense.size))
    rank[0, dense] = np.arange(dense.size)
    rank[1, lexical] = np.arange(dense.size)
    fused = np.argsort(-(1.0 / (RRF_K + 1 + rank)).sum(axis=0), kind="stable")
    return {"dense": dense, "bm25": lexical, "rrf": fused}


def _first(order: list[str], ids: set[str]) -> int | None:
    return next((i for i, m in enumerate(order) if m in ids), None)


def score_scale(root: Path, scale: str, settings: Settings, keep_markers: bool = False,
                ks: Sequence[int] = KS) -> dict[str, Any]:
    """Recall@K per method (overall and per ability at the largest K) and update-first of one scale."""
    chats = scale_chats(root, scale)
    embedder = embedder_for(settings)
    chats_asked = 0
    hits: dict[str, dict[str, list[float]]] = {m: {} for m in METHODS}
    first = {m: [0, 0] for m in METHODS}
    questions = undecided = 0
    for chat in chats:
        qs, _ = load_questions(chat.parent, beam_user(chat))
        if not qs:
            continue
        chats_asked += 1
        ids, texts = chat_messages(chat, keep_markers)
        vectors = embedder.embed(texts)
        bm25 = Okapi(texts)
        qvecs = embedder.embed([q["question"] for q in qs])
        for q, qv in zip(qs, qvecs):
            questions += 1
            undecided += undecidable(q)
            for method, order in rankings(qv, q["question"], vectors, bm25).items():
                ranked = [ids[i] for i in order]
                for k in ks:
                    got = len(q["evidence"] & set(ranked[:k])) / len(q["evidence"])
                    hits[method].setdefault(f"R@{k}", []).append(got)
                    if k == max(ks):
                        hits[method].setdefault(q["ability"], []).append(got)
                if q.get("updated"):
                    up, orig = _first(ranked, q["updated"]), _first(ranked, q.get("original", set()))
                    first[method][0] += up is not None and (orig is None or up < orig)
                    first[method][1] += 1
    if not questions:
        raise ConfigError(f"{root / scale}: no chat has a question with evidence", path=str(root / scale))
    return {"scale": scale, "questions": questions, "chats": chats_asked, "keep_markers": keep_markers,
            "ks": tuple(ks), "embedder": embedder.model_name,
            "rows": {m: {name: float(np.mean(v)) for name, v in hits[m].items()} for m in METHODS},
            "update_first": {m: first[m][0] / first[m][1] if first[m][1] else float("nan") for m in METHODS},
            "uf n": first[METHODS[0]][1], "uf undecidable": undecided,
            "uf decidable": {m: first[m][0] / (first[m][1] - undecided) if first[m][1] > undecided else float("nan")
                             for m in METHODS}}


def report(res: dict[str, Any]) -> str:
    """One Markdown table of a scale: R@K per method, update-first, R@{max K} per ability."""
    ks = res["ks"]
    k = max(ks)
    abilities = sorted(a for a in res["rows"]["dense"] if not a.startswith("R@"))
    head = ["method"] + [f"R@{x}" for x in ks] + ["update-first (whole ranking)", "uf decidable"] + [
        f"{short(a)} R@{k}" for a in abilities]
    text = "content as published (markers kept)" if res["keep_markers"] else "stored text (markers stripped)"
    lines = [f"BEAM {res['scale']} raw-message anchors: {res['chats']} chats, {res['questions']} questions "
             f"with evidence, {text}, embedder {res['embedder']}",
             f"update-first: {res['uf n']} knowledge_update questions, {res['uf undecidable']} undecidable (the "
             f"updated message is an original one too: never first); uf decidable = over the other "
             f"{res['uf n'] - res['uf undecidable']}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method in METHODS:
        row = res["rows"][method]
        cells = [method] + [f"{row[f'R@{x}']:.3f}" for x in ks] + [f"{res['update_first'][method]:.3f}",
                                                                   f"{res['uf decidable'][method]:.3f}"]
        lines.append("| " + " | ".join(cells + [f"{row[a]:.3f}" for a in abilities]) + " |")
    return "\n".join(lines)


def bench_beam_anchors(path: str, *, scales: Sequence[str] | None = None, keep_markers: bool = False,
                       settings: Settings | None = None) -> str:
    """The anchors of every requested scale (default: every scale folder under `path`)."""
    root = Path(path)
    cfg = settings or Settings()
    return "\n\n".join(report(score_scale(root, scale, cfg, keep_markers))
                       for scale in requested_scales(root, scales))
