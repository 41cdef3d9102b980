"""Retrieval over a user's history: BM25 (rank-bm25's Okapi BM25) for the rag baseline and history-conditioned
prompts, and a dense index over the device's sentence encoder (all-MiniLM-L6-v2), measured against it.

    Bm25Index(["cats purr", "dogs bark", "cats and dogs"]).top("why do cats purr", 1) -> [0]

Text is lowercased and split into letters/digits runs; the task instruction shared by every input
("Generate a headline for the following article:") is just a frequent term, which BM25's IDF
already discounts. Ties keep history order. `DenseIndex` ranks by cosine similarity of MiniLM embeddings
(computed in this process, never sent anywhere); it is the `dense` ablation of the prompt examples
(docs/RESULTS.md), not the device's default. Nothing here loads a language model.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

RETRIEVALS = ("bm25", "minilm")

_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    """Lowercased alphanumeric runs: words("Don't STOP-now") -> ["don", "t", "stop", "now"]."""
    return _WORD.findall(text.lower())


class Bm25Index:
    """An index over a fixed list of documents; `top` returns document positions, best first."""

    def __init__(self, documents: Sequence[str]) -> None:
        from rank_bm25 import BM25Okapi

        if not documents:
            raise ValueError("BM25 needs at least one document")
        # rank-bm25 divides by the mean document length: an empty token list must not be the only one.
        self._bm25 = BM25Okapi([words(doc) or [""] for doc in documents])
        self.size = len(documents)

    def scores(self, query: str) -> np.ndarray:
        return np.asarray(self._bm25.get_scores(words(query)), dtype=np.float64)

    def top(self, query: str, k: int) -> list[int]:
        """Positions of the k best-scoring documents (all of them if there are fewer than k)."""
        return best_positions(self.scores(query), k)


class DenseIndex:
    """Cosine similarity of sentence-encoder embeddings; the same `top` as `Bm25Index`.

    The documents are embedded on first use (the encoder keeps recent embeddings in memory for the process).
    """

    def __init__(self, documents: Sequence[str]) -> None:
        if not documents:
            raise ValueError("a dense index needs at least one document")
        self._documents = list(documents)
        self._matrix: np.ndarray | None = None
        self.size = len(documents)

    def scores(self, query: str) -> np.ndarray:
        from localpers.engine.encoder import embed_texts

        if self._matrix is None:
            self._matrix = embed_texts(self._documents)
        return (self._matrix @ embed_texts([query])[0]).astype(np.float64)

    def top(self, query: str, k: int) -> list[int]:
        return best_positions(self.scores(query), k)


HistorySearch = Bm25Index | DenseIndex


def best_positions(scores: np.ndarray, k: int) -> list[int]:
    """Positions of the k highest scores, best first; ties keep document order."""
    order = np.argsort(-scores, kind="stable")
    return [int(i) for i in order[:k]]


def make_index(documents: Sequence[str], retrieval: str = "bm25") -> HistorySearch:
    """The index `retrieval` names ("bm25" or "minilm") over `documents`."""
    if retrieval == "bm25":
        return Bm25Index(documents)
    if retrieval == "minilm":
        return DenseIndex(documents)
    raise ValueError(f"unknown retrieval {retrieval!r}; choose one of: {', '.join(RETRIEVALS)}")
