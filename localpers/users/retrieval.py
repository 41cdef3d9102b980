"""Retrieval over a user's history: BM25 (rank-bm25's Okapi BM25) for the rag baseline and history-conditioned
prompts, and a dense index over the device's sentence encoder (all-MiniLM-L6-v2), measured against it.

    Bm25Index(["cats purr", "dogs bark", "cats and dogs"]).top("why do cats purr", 1) -> [0]

Text is casefolded and split into runs of letters and digits of any script (`words`); the task instruction shared by every input
("Generate a headline for the following article:") is just a frequent term, which BM25's IDF
already discounts. Ties keep history order. `DenseIndex` ranks by cosine similarity of MiniLM embeddings
(computed in this process, never sent anywhere); it is the `dense` ablation of the prompt examples
(docs/RESULTS.md), not the device's default. Nothing here loads a language model.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

import numpy as np

RETRIEVALS = ("bm25", "minilm")

_WORD = re.compile(r"[^\W_]+")  # letters and digits of any script
# Scripts written without spaces between words (Thai, Lao, Myanmar, Khmer, Kana, Han): a run of them is one
# "word" to the pattern above, so it is split into overlapping character pairs, as search engines index them.
_SPACELESS = re.compile(
    r"[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+"
)


def words(text: str) -> list[str]:
    """Casefolded runs of letters and digits in any script, character pairs in scripts without spaces.

    words("Don't STOP-now") -> ["don", "t", "stop", "now"]; words("Straße in Köln") -> ["strasse", "in", "köln"];
    words("北京一周") -> ["北京", "京一", "一周"]. (ASCII text splits as it always did: `[a-z0-9]+` of its lower
    case; an English-only pattern left CJK, Arabic or Hebrew text with no words and cut "Köln" into "k", "ln".)
    """
    found: list[str] = []
    for run in _WORD.findall(unicodedata.normalize("NFKC", text).casefold()):
        if run.isascii():
            found.append(run)
            continue
        start = 0
        for spaceless in _SPACELESS.finditer(run):
            if spaceless.start() > start:
                found.append(run[start : spaceless.start()])
            chars = spaceless.group()
            found.extend([chars] if len(chars) == 1 else [chars[i : i + 2] for i in range(len(chars) - 1)])
            start = spaceless.end()
        if start < len(run):
            found.append(run[start:])
    return found


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
