"""RF-Mem in NumPy against the paper: signal (Eqs. 1-2), gate (Eq. 3), KMeans, and Algorithm 3
against a naive transcription that scans every row each round; plus BM25 and calibration."""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from memory import terms
from memory.settings import RetrievalSettings
from memory.terms import tokenize
from retrieval import lexical, rfmem
from retrieval.calibration import calibrate
from retrieval.lexical import QUESTION_WORDS, BM25Index


def _unit(a: np.ndarray) -> np.ndarray:
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def memory() -> tuple[np.ndarray, list[np.ndarray]]:
    rng = np.random.default_rng(7)
    centers = _unit(rng.standard_normal((40, 64)))
    z = _unit(centers[rng.integers(0, 40, 3000)] + 0.25 * rng.standard_normal((3000, 64))).astype(np.float32)
    queries = [_unit(centers[i] + 0.35 * rng.standard_normal(64)).astype(np.float32) for i in range(40)]
    return z, queries


def naive_recollection(x_t: np.ndarray, z: np.ndarray, k: int, beam: int, fanout: int, rounds: int,
                       alpha: float, prior: np.ndarray) -> list[int]:
    """Algorithm 3 line by line, with a full scan per recollect query."""
    x0 = _unit(x_t)
    queries = [x0]
    seen: dict[int, float] = {}
    for r in range(rounds):
        n = (beam + r) * fanout
        nxt = []
        for x in queries:
            scores = z @ x + prior
            c = rfmem.top_k(scores, n)
            labels, _ = rfmem.kmeans(z[c], min(beam, len(c)))
            for b in np.unique(labels):
                g_rows = c[labels == b]
                g = _unit(z[g_rows].mean(axis=0))
                nxt.append((_unit(alpha * x + (1 - alpha) * g + x0), g_rows))
        keep = rfmem.top_k(np.array([(z[g] @ xb).sum() for xb, g in nxt]), beam)
        for bi in keep:
            xb, g_rows = nxt[bi]
            for i in g_rows:
                seen.setdefault(int(i), float(z[i] @ xb + prior[i]))
        queries = [nxt[bi][0] for bi in keep]
        if len(seen) >= k:
            break
    ids = np.array(list(seen))
    return ids[rfmem.top_k(np.array(list(seen.values()), dtype=np.float32), k)].tolist()


def test_signal_matches_equations() -> None:
    s = np.array([0.9, 0.5, 0.4, 0.3])
    mean, h = rfmem.familiarity_signal(s, lam=20.0, normalized=False)
    p = np.exp(20 * (s - s.max()))
    p /= p.sum()
    assert mean == pytest.approx(0.525) and h == pytest.approx(-(p * np.log(p)).sum())
    _, hn = rfmem.familiarity_signal(s, lam=20.0)
    assert hn == pytest.approx(h / math.log(4))
    assert rfmem.familiarity_signal(np.full(10, 0.5), 20.0)[1] == pytest.approx(1.0)  # uniform: max entropy


def test_gate_follows_equation_3() -> None:
    g = lambda m, h: rfmem.gate(m, h, theta_high=0.6, theta_low=0.3, tau=0.5)  # noqa: E731
    assert g(0.7, 0.99) == "familiarity"
    assert g(0.2, 0.01) == "recollection"  # Eq. 3, where Algorithm 1's "or" would say familiarity
    assert g(0.45, 0.4) == "familiarity" and g(0.45, 0.6) == "recollection"


def test_kmeans_separates_obvious_groups() -> None:
    x = np.array([[1, 0], [0.99, 0.01], [0, 1], [0.01, 0.99], [-1, 0]], dtype=np.float32)
    labels, centers = rfmem.kmeans(x, 3)
    assert labels[0] == labels[1] and labels[2] == labels[3] and len(set(labels.tolist())) == 3
    assert np.allclose(centers[labels[0]], [0.995, 0.005])
    assert rfmem.kmeans(np.ones((4, 2), dtype=np.float32), 3)[0].tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("with_prior", [False, True])
def test_recollection_equals_naive_algorithm_3(memory: tuple[np.ndarray, list[np.ndarray]], with_prior: bool) -> None:
    z, queries = memory
    rng = np.random.default_rng(3)
    prior = (rng.random(z.shape[0]) < 0.05).astype(np.float32) * 0.3 if with_prior else np.zeros(z.shape[0], np.float32)
    for q in queries:
        ref = naive_recollection(q, z, 10, beam=3, fanout=2, rounds=3, alpha=0.5, prior=prior)
        for head in (64, 256, 10**9):
            got = rfmem.recollection(q, z, 10, beam=3, fanout=2, rounds=3, alpha=0.5,
                                     prior=prior if with_prior else None, head=head)
            assert got.idx.tolist() == ref


def test_exact_top_n_with_bounds(memory: tuple[np.ndarray, list[np.ndarray]]) -> None:
    z, queries = memory
    x = queries[0]
    upper = z @ x + np.random.default_rng(1).random(z.shape[0]).astype(np.float32) * 0.5
    rows, scores, used = rfmem.exact_top_n(z, x, upper, 7)
    assert rows.tolist() == rfmem.top_k(z @ x, 7).tolist() and np.allclose(scores, (z @ x)[rows])


def test_top_k_orders_and_clips() -> None:
    assert rfmem.top_k(np.array([0.1, 0.9, 0.5]), 5).tolist() == [1, 2, 0]
    assert rfmem.top_k(np.array([]), 3).size == 0


def test_bm25_prefers_rare_matching_terms() -> None:
    ix = BM25Index(["Caroline went to the LGBTQ support group", "Melanie paints sunrises", None,
                    "the group went hiking", "support support support"])
    s = ix.scores("When did Caroline go to the support groups?")
    assert s.argmax() == 0 and s[1] == 0 and s[2] == 0
    assert tokenize("The Paintings, of Sunrises!") == ["painting", "sunrise"]
    assert BM25Index([]).scores("anything").size == 0


def test_question_words_are_left_out_of_the_query_only() -> None:
    """"did", "does" and the verbs of saying point at the conversation: a turn that merely says "did"
    gets nothing from them, while the stored terms keep them and the fold of "does" ("doe") stays a word."""
    ix = BM25Index(["I did the dishes after dinner", "My bike chain broke on the hill", "John Doe called"])
    plain = ix.scores("What did I say about the hill?")
    assert plain[0] > 0 and plain[1] > 0
    skipped = ix.scores("What did I say about the hill?", QUESTION_WORDS)
    assert skipped[0] == 0 and skipped[1] == plain[1]
    assert ix.scores("What did you recommend about Doe?", QUESTION_WORDS).argmax() == 2
    assert ix.scores("did you say it", QUESTION_WORDS).max() == 0
    assert tokenize("How does he say it", QUESTION_WORDS) == []


def test_bm25_reads_every_script_alike_on_both_sides() -> None:
    """Letters of any script are words (the ASCII-only split made "résumé" r + sum and dropped Cyrillic,
    Hindi, Chinese); query and documents split by the same expression, combining marks included."""
    assert tokenize("Mon résumé, ma гитару, 吉他 and हिन्दी x_y") == ["mon", "résumé", "ma", "гитару", "吉他", "हिन्दी",
                                                                     "x", "y"]
    ix = BM25Index(["The sum of the bills", "Я купил гитару вчера", "मैं हिन्दी बोलता हूँ", "我买了吉他"])
    assert ix.scores("résumé").max() == 0                             # no longer "sum"
    for query, doc in (("гитару", 1), ("हिन्दी", 2), ("我买了吉他", 3)):
        s = ix.scores(query)
        assert s.argmax() == doc and s[doc] > 0, query


def test_bm25_built_in_parts_equals_one_part(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = ["a long turn about guitars and chords " * 200, None, "short guitar note", ""] + \
        [f"fragment {i} about chords and guitars" for i in range(50)]
    monkeypatch.setattr(terms, "PARTS_PER_THREAD", 1)
    monkeypatch.setattr(terms.pl, "thread_pool_size", lambda: 1)
    one = BM25Index(texts, b=0.9)
    monkeypatch.setattr(terms, "PARTS_PER_THREAD", 4)
    monkeypatch.setattr(terms.pl, "thread_pool_size", lambda: 2)
    assert len(terms.text_parts(pa.array(texts, pa.string()))) > 2     # the long turn does not hold up one part
    parts = BM25Index(texts, b=0.9)
    assert np.array_equal(one.terms, parts.terms) and abs(one.matrix - parts.matrix).max() == 0


def test_bm25_scores_from_tokens_equal_scores_from_the_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = ["Caroline went to the LGBTQ support group twice", None, "support groups meet weekly",
             "Melanie paints sunrises and sunsets", "the group went hiking"] * 20
    ix = BM25Index(texts, b=0.9)
    ix.matrix                                            # built: the matrix path
    queries = ["When did Caroline go to the support groups?", "sunrises", "nothing matches here", ""]
    want = [ix.scores(q) for q in queries]
    monkeypatch.setattr(lexical, "_BUILDER", type("Never", (), {"submit": lambda self, fn: None})())
    cold = BM25Index(texts, b=0.9)                       # never built: every score from the tokens
    assert not cold.built and ix.built
    for q, w in zip(queries, want):
        assert np.array_equal(cold.scores(q), w)         # bit-identical, not merely close
    assert want[0].argmax() == 0 and want[2].max() == 0


def test_calibration_places_thresholds_in_the_score_range(memory: tuple[np.ndarray, list[np.ndarray]]) -> None:
    z, _ = memory
    cal = calibrate(z, RetrievalSettings())
    assert cal["samples"] > 100 and -1 < cal["theta_low"] < cal["theta_high"] < 1 and 0 < cal["tau"] < 1
    tiny = calibrate(z[:2], RetrievalSettings())
    assert tiny["samples"] == 0 and tiny["theta_high"] == RetrievalSettings().theta_high
