"""The lexical channel: Okapi BM25 over one user's memory texts, scored in NumPy.

The terms of every row are stored with it (`schemas.TERMS`, worked out at write time by
`memory.terms`), so indexing a user's memories reads them and hashes them; rows written before
terms were stored are tokenized on load (Polars, in Rust). The index is a SciPy CSC matrix of
precomputed BM25 term weights, so scoring a query is one sparse column sum over its terms.
Why not a search engine: a tantivy or LanceDB FTS index lives per table, not per user, and answers
top hits only; fusion with the dense channel wants a score for every candidate row, and the
recollection rounds must stay in memory.
"""
from __future__ import annotations

import logging
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from scipy import sparse

from memory.lexicon import saying_forms
from memory.terms import token_frame, tokenize

log = logging.getLogger(__name__)


def warm() -> None:
    """Load the stop words and compile the token regex now, with the retriever, not in a user's
    first query (scikit-learn's import takes 0.7 s; the regex a few ms)."""
    tokenize("warm")


def _term_hashes(texts: pa.Array, stored: pa.Array | None) -> tuple[pl.DataFrame, int]:
    """(doc, term hash) of every term, from the stored terms where a row has them, else from its
    text; and how many rows had to be tokenized."""
    if stored is None:
        frame, todo = token_frame(texts), len(texts)
    else:
        missing = pc.is_null(stored).to_numpy(zero_copy_only=False)
        lengths = pc.fill_null(pc.list_value_length(stored), 0).to_numpy(zero_copy_only=False)
        frame = pl.DataFrame({"doc": np.repeat(np.arange(len(stored), dtype=np.uint32), lengths),
                              "tok": pl.Series(pc.list_flatten(stored), dtype=pl.Utf8)})
        rows = np.flatnonzero(missing)
        if rows.size:
            frame = pl.concat([frame, token_frame(texts.take(pa.array(rows)), rows)])
        todo = int(rows.size)
    return frame.select("doc", pl.col("tok").hash().alias("h")), todo


class BM25Index:
    """BM25 weights of every (memory, term) pair of one user's texts.

    Terms are identified by their Polars 64-bit hash (fixed seed), so building needs no string
    group-by or vocabulary join. They are the rows' stored `terms` where given (`schemas.TERMS`),
    else their texts tokenized in parts of about equal length on Polars' threads. The term matrix
    (CSC, one column of weights per distinct hash) is then built on a background thread, and until
    it is ready a query is scored from the hashed terms themselves (the first query of a cold index
    does not wait for it). Both paths compute the same float32 weights
    and add them up term by term in hash order, so they give bit-identical scores.
    """

    def __init__(self, texts: Sequence[str | None] | pa.Array | pa.ChunkedArray, k1: float = 1.2,
                 b: float = 0.75, terms: pa.Array | pa.ChunkedArray | None = None) -> None:
        self.n_docs = n = len(texts)
        self.k1, self.b = k1, b
        arr = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else \
            texts if isinstance(texts, pa.Array) else pa.array(list(texts), pa.string())
        stored = terms.combine_chunks() if isinstance(terms, pa.ChunkedArray) else terms
        toks, self.tokenized = _term_hashes(arr, stored)   # rows tokenized here (no stored terms)
        self.doc_len = np.bincount(toks["doc"].to_numpy(), minlength=n).astype(np.float32)
        self.avg = float(self.doc_len.mean()) if n and self.doc_len.mean() > 0 else 1.0
        self._tokens: pl.DataFrame | None = toks
        self._matrix: sparse.csc_matrix | None = None
        self._terms = np.zeros(0, dtype=np.uint64)
        self._built = _BUILDER.submit(self._build)

    def _weights(self, tf: np.ndarray, df: np.ndarray, doc: np.ndarray) -> np.ndarray:
        """BM25 weight (float32) of term frequencies `tf` in docs `doc` for terms of document frequency `df`."""
        idf = np.log1p((self.n_docs - df + 0.5) / (df + 0.5))
        k1, b = self.k1, self.b
        return (idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * self.doc_len[doc] / self.avg))).astype(np.float32)

    def _build(self) -> None:
        toks = self._tokens
        assert toks is not None
        terms = toks["h"].unique().sort()
        cols = pl.DataFrame({"h": terms, "col": np.arange(len(terms), dtype=np.int64)})
        d = toks["doc"].to_numpy().astype(np.int64)
        c = toks.join(cols, on="h", how="left")["col"].to_numpy()
        m = sparse.csc_matrix((np.ones(d.size, np.float32), (d, c)), shape=(self.n_docs, max(len(terms), 1)))
        m.sum_duplicates()   # data = term frequency of each (doc, term), rows sorted within each column
        df = np.diff(m.indptr).astype(np.float32)
        m.data = self._weights(m.data, np.repeat(df, np.diff(m.indptr)), m.indices)
        self._terms, self._matrix = terms.to_numpy(), m
        self._tokens = None

    @property
    def built(self) -> bool:
        """Whether the term matrix is built (queries are scored from it, not from the tokens)."""
        return self._matrix is not None

    @property
    def matrix(self) -> sparse.csc_matrix:
        """The (docs x terms) weight matrix (waits for the background build)."""
        self._built.result()
        assert self._matrix is not None
        return self._matrix

    @property
    def terms(self) -> np.ndarray:
        """The sorted term hashes, one per matrix column (waits for the background build)."""
        self._built.result()
        return self._terms

    def scores(self, query: str, skip: Collection[str] = ()) -> np.ndarray:
        """BM25 score of every memory for the query without the words in `skip` (zeros when no term
        matches)."""
        out = np.zeros(self.n_docs, dtype=np.float32)
        tokens = tokenize(query, skip)
        if not tokens or self.n_docs == 0:
            return out
        hashes = np.unique(pl.Series(tokens, dtype=pl.Utf8).hash().to_numpy())
        m, toks = self._matrix, self._tokens
        if m is not None or toks is None:
            m, terms = self.matrix, self._terms
            pos = np.minimum(np.searchsorted(terms, hashes), max(terms.size - 1, 0))
            for col in (pos[terms[pos] == hashes] if terms.size else []):
                lo, hi = m.indptr[col], m.indptr[col + 1]
                out[m.indices[lo:hi]] += m.data[lo:hi]
            return out
        # NumPy, not Polars: the matrix is being built on Polars' threads meanwhile
        every = toks["h"].to_numpy()
        hit = np.isin(every, hashes)
        h, doc = every[hit], toks["doc"].to_numpy()[hit].astype(np.int64)
        order = np.lexsort((doc, h))
        h, doc = h[order], doc[order]
        pair = np.flatnonzero(np.r_[True, (h[1:] != h[:-1]) | (doc[1:] != doc[:-1])]) if h.size else order
        tf = np.diff(np.r_[pair, h.size]).astype(np.float32)
        h, doc = h[pair], doc[pair]
        starts = np.flatnonzero(np.r_[True, h[1:] != h[:-1]]) if h.size else np.zeros(0, dtype=np.int64)
        ends = np.r_[starts[1:], h.size]
        for lo, hi in zip(starts.tolist(), ends.tolist()):
            df = np.full(hi - lo, hi - lo, dtype=np.float32)
            out[doc[lo:hi]] += self._weights(tf[lo:hi], df, doc[lo:hi])
        return out


#: builds term matrices in the background (one index at a time is plenty: a query never waits on it)
_BUILDER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mnemo-bm25")


#: words a question about an earlier conversation is full of and its turns rarely hold, so rare in the
#: user's memory that BM25 weighs them most and lifts whichever few turns happen to say them, while
#: they point at the conversation, not at what was said: the forms of "do" and "have" scikit-learn's
#: stop list lacks ("How did I ...", "What does my ...") and the verbs of saying ("did I mention",
#: "you told me", "what did you recommend"). The strategies' BM25 leaves them out of the query (the
#: dense channel reads the whole question; stored terms keep them). BEAM 100K R@10 0.657 -> 0.666
#: (information extraction 0.750 -> 0.825), 500K unchanged, LoCoMo 0.687 -> 0.692. English only.
QUESTION_WORDS = frozenset(("did", "didn", "does", "doesn", "doing", "having") + saying_forms(
    "say", "mention", "tell", "recommend", "suggest", "advise", "ask", "share", "explain", "describe", "outline",
    "propose"))


def normalized(scores: np.ndarray) -> np.ndarray:
    """Scores divided by their maximum (in [0, 1]; all zeros stay zeros)."""
    top = float(scores.max()) if scores.size else 0.0
    return scores / top if top > 0 else scores
