"""BM25 retrieval over a user's history (rank-bm25's Okapi BM25): the rag baseline and history-conditioned prompts.

    Bm25Index(["cats purr", "dogs bark", "cats and dogs"]).top("why do cats purr", 1) -> [0]

Text is lowercased and split into letters/digits runs; the task instruction shared by every input
("Generate a headline for the following article:") is just a frequent term, which BM25's IDF
already discounts. Ties keep history order. This module knows nothing of models.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

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
        scores = self.scores(query)
        order = np.argsort(-scores, kind="stable")
        return [int(i) for i in order[:k]]
