"""The lexical channel: Okapi BM25 over one user's memory texts, scored in NumPy.

Tokenization runs in Polars (Rust: lowercase, regex split, explode, hash), so indexing a
user's memories fits in a cold query; the index is a SciPy CSC matrix of
precomputed BM25 term weights, so scoring a query is one sparse column sum over its terms.
Why not a search engine: a tantivy or LanceDB FTS index lives per table, not per user, and answers
top hits only; fusion with the dense channel wants a score for every candidate row, and the
recollection rounds must stay in memory. Tokens are runs of letters and digits of any script (no
Unicode normalization: an NFD text and its NFC query do not match). Stop words are scikit-learn's
English list; a light plural folding ("paintings" -> "painting") is the only stemming.
"""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from scipy import sparse
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

log = logging.getLogger(__name__)

#: letters and digits of any script (Rust regex `\w`, marks included), no underscore: "café", "гитару"
TOKEN_RE = r"[^\W_]+"
STOP_WORDS = frozenset(ENGLISH_STOP_WORDS)


def _fold(token: str) -> str:
    if len(token) > 3 and token.endswith("s") and not token.endswith("ss"):
        return token[:-1]
    return token


def words(text: pl.Expr) -> pl.Expr:
    """Lowercase word tokens of a text column: one Polars expression for documents and queries, so
    both sides split alike (Python's `\w` differs from Rust's on combining marks: Hindi, Thai)."""
    return text.str.to_lowercase().str.extract_all(TOKEN_RE)


def tokenize(text: str) -> list[str]:
    """Lowercase word tokens without stop words, plurals folded (the query side)."""
    found = pl.Series([text], dtype=pl.Utf8).to_frame("t").select(words(pl.col("t"))).item().to_list()
    return [_fold(t) for t in found if t not in STOP_WORDS]


_STOP = pl.Series(sorted(STOP_WORDS))
#: texts are tokenized in this many parts per Polars thread, run at once (`pl.collect_all`)
PARTS_PER_THREAD = 2


def text_parts(texts: pa.Array) -> list[tuple[int, int]]:
    """(start, end) row ranges of about equal text length, a few per Polars thread: one long turn
    can outweigh thousands of fragments, so equal row counts would leave threads idle."""
    n = len(texts)
    parts = max(1, min(n, pl.thread_pool_size() * PARTS_PER_THREAD))
    if parts == 1:
        return [(0, n)] if n else []
    lengths = pc.fill_null(pc.utf8_length(texts), 0).to_numpy(zero_copy_only=False)
    cuts = np.searchsorted(np.cumsum(lengths), np.linspace(0, lengths.sum(), parts + 1)[1:-1])
    bounds = [0, *sorted(set(int(x) + 1 for x in cuts if 0 <= x < n - 1)), n]
    return [(a, z) for a, z in zip(bounds, bounds[1:]) if z > a]


def _tokens(texts: pa.Array, offset: int) -> pl.LazyFrame:
    """(doc, term hash) of every token of `texts`, docs numbered from `offset` (see `tokenize`)."""
    tok = pl.col("tok")
    folded = pl.when((tok.str.len_chars() > 3) & tok.str.ends_with("s") & ~tok.str.ends_with("ss")) \
        .then(tok.str.slice(0, tok.str.len_chars() - 1)).otherwise(tok)
    return (pl.LazyFrame({"text": pl.Series("text", texts, dtype=pl.Utf8).fill_null("")})
            .with_row_index("doc", offset=offset)
            .select("doc", words(pl.col("text")).alias("tok"))
            .explode("tok").drop_nulls("tok")
            .filter(~tok.is_in(_STOP.implode()))
            .select("doc", folded.hash().alias("h")))


class BM25Index:
    """BM25 weights of every (memory, term) pair of one user's texts.

    Terms are identified by their Polars 64-bit hash (fixed seed), so building needs no string
    group-by or vocabulary join. The texts are tokenized in parts of about equal length on Polars'
    threads; the term matrix (CSC, one column of weights per distinct hash) is then built on a
    background thread, and until it is ready a query is scored from the tokens themselves (the
    first query of a cold index does not wait for it). Both paths compute the same float32 weights
    and add them up term by term in hash order, so they give bit-identical scores.
    """

    def __init__(self, texts: Sequence[str | None] | pa.Array | pa.ChunkedArray, k1: float = 1.2,
                 b: float = 0.75) -> None:
        self.n_docs = n = len(texts)
        self.k1, self.b = k1, b
        arr = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else \
            texts if isinstance(texts, pa.Array) else pa.array(list(texts), pa.string())
        parts = pl.collect_all([_tokens(arr.slice(a, z - a), a) for a, z in text_parts(arr)])
        toks = pl.concat(parts) if parts else pl.DataFrame({"doc": [], "h": []},
                                                          schema={"doc": pl.UInt32, "h": pl.UInt64})
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

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every memory for the query (zeros when no term matches)."""
        out = np.zeros(self.n_docs, dtype=np.float32)
        tokens = tokenize(query)
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
        hits = (toks.filter(pl.col("h").is_in(pl.Series(hashes).implode()))
                .group_by("h", "doc").len().sort("h", "doc"))
        h, doc = hits["h"].to_numpy(), hits["doc"].to_numpy().astype(np.int64)
        tf = hits["len"].to_numpy().astype(np.float32)
        starts = np.flatnonzero(np.r_[True, h[1:] != h[:-1]]) if h.size else np.zeros(0, dtype=np.int64)
        ends = np.r_[starts[1:], h.size]
        for lo, hi in zip(starts.tolist(), ends.tolist()):
            df = np.full(hi - lo, hi - lo, dtype=np.float32)
            out[doc[lo:hi]] += self._weights(tf[lo:hi], df, doc[lo:hi])
        return out


#: builds term matrices in the background (one index at a time is plenty: a query never waits on it)
_BUILDER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mnemo-bm25")


def normalized(scores: np.ndarray) -> np.ndarray:
    """Scores divided by their maximum (in [0, 1]; all zeros stay zeros)."""
    top = float(scores.max()) if scores.size else 0.0
    return scores / top if top > 0 else scores
