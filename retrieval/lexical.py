"""The lexical channel: Okapi BM25 over one user's memory texts, scored in NumPy.

Tokenization runs in Polars (Rust: lowercase, regex split, explode, hash), so indexing a
user's memories fits in a cold query; the index is a SciPy CSC matrix of
precomputed BM25 term weights, so scoring a query is one sparse column sum over its terms.
Why not a search engine: a tantivy or LanceDB FTS index lives per table, not per user, and answers
top hits only; fusion with the dense channel wants a score for every candidate row, and the
recollection rounds must stay in memory. Stop words are scikit-learn's English list; a light
plural folding ("paintings" -> "painting") is the only stemming.
"""
from __future__ import annotations

import logging
import re
from typing import Sequence

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from scipy import sparse
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

log = logging.getLogger(__name__)

TOKEN_RE = r"[a-z0-9]+"
_TOKEN = re.compile(TOKEN_RE)
STOP_WORDS = frozenset(ENGLISH_STOP_WORDS)


def _fold(token: str) -> str:
    if len(token) > 3 and token.endswith("s") and not token.endswith("ss"):
        return token[:-1]
    return token


def tokenize(text: str) -> list[str]:
    """Lowercase word tokens without stop words, plurals folded (the query side)."""
    return [_fold(t) for t in _TOKEN.findall(text.lower()) if t not in STOP_WORDS]


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
            .select("doc", pl.col("text").str.to_lowercase().str.extract_all(TOKEN_RE).alias("tok"))
            .explode("tok").drop_nulls("tok")
            .filter(~tok.is_in(_STOP.implode()))
            .select("doc", folded.hash().alias("h")))


class BM25Index:
    """BM25 weights of every (memory, term) pair of one user's texts.

    Terms are identified by their Polars 64-bit hash (fixed seed), so building needs no string
    group-by or vocabulary join: the sorted distinct hashes are the columns, and SciPy's duplicate
    summing gives the term frequencies. Queries hash their tokens the same way. The texts are
    tokenized in parts of about equal length, run in parallel on Polars' threads (a cold query).
    """

    def __init__(self, texts: Sequence[str | None] | pa.Array | pa.ChunkedArray, k1: float = 1.2,
                 b: float = 0.75) -> None:
        self.n_docs = n = len(texts)
        arr = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else \
            texts if isinstance(texts, pa.Array) else pa.array(list(texts), pa.string())
        parts = pl.collect_all([_tokens(arr.slice(a, z - a), a) for a, z in text_parts(arr)])
        toks = pl.concat(parts) if parts else pl.DataFrame({"doc": [], "h": []},
                                                          schema={"doc": pl.UInt32, "h": pl.UInt64})
        d = toks["doc"].to_numpy().astype(np.int64)
        self.terms = toks["h"].unique().sort().to_numpy()
        c = np.searchsorted(self.terms, toks["h"].to_numpy())
        n_terms = max(len(self.terms), 1)
        m = sparse.csr_matrix((np.ones(d.size, np.float32), (d, c.ravel())), shape=(n, n_terms))
        m.sum_duplicates()  # data = term frequency of each (doc, term)
        tf = m.data
        doc_len = np.bincount(d, minlength=n).astype(np.float32)
        avg = float(doc_len.mean()) if n and doc_len.mean() > 0 else 1.0
        doc_of = np.repeat(np.arange(n), np.diff(m.indptr))
        df_t = np.bincount(m.indices, minlength=n_terms).astype(np.float32)
        idf = np.log1p((n - df_t + 0.5) / (df_t + 0.5))
        m.data = (idf[m.indices] * tf * (k1 + 1) / (tf + k1 * (1 - b + b * doc_len[doc_of] / avg))).astype(np.float32)
        self.matrix = m.tocsc()

    def columns(self, query: str) -> list[int]:
        """Matrix columns of the query's terms that occur in the user's texts."""
        tokens = tokenize(query)
        if not tokens or self.terms.size == 0:
            return []
        h = pl.Series(tokens, dtype=pl.Utf8).hash().to_numpy()
        pos = np.minimum(np.searchsorted(self.terms, h), self.terms.size - 1)
        return sorted(set(pos[self.terms[pos] == h].tolist()))

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every memory for the query (zeros when no term matches)."""
        cols = self.columns(query)
        if not cols or self.n_docs == 0:
            return np.zeros(self.n_docs, dtype=np.float32)
        return np.asarray(self.matrix[:, cols].sum(axis=1), dtype=np.float32).ravel()


def normalized(scores: np.ndarray) -> np.ndarray:
    """Scores divided by their maximum (in [0, 1]; all zeros stay zeros)."""
    top = float(scores.max()) if scores.size else 0.0
    return scores / top if top > 0 else scores
