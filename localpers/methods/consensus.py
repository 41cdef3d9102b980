"""Consensus choice among candidate outputs (minimum Bayes risk decoding with ROUGE-1 as the utility).

Given a few outputs for the same prompt (the greedy one and samples, `localpers.engine.candidates`), the
one that agrees most with the others is the best guess at what the model means: each candidate's score is
its mean ROUGE-1 F1 (stemmed, as the benchmark scores) against every other candidate, and the highest score
wins, the earliest candidate on a tie. Identical candidates count as separate evidence, as samples do.

This module decodes nothing and knows nothing about users: it only scores texts against each other.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

# The most candidates one rewrite decodes (the engine's batched sequences, `Personalizer`); every front end's limit.
MAX_CANDIDATES = 16


@dataclass(frozen=True)
class ConsensusChoice:
    """Which candidate was chosen and every candidate's mean agreement with the others."""

    index: int
    scores: tuple[float, ...]


@functools.lru_cache(maxsize=1)
def _tokenizer():  # noqa: ANN202 - rouge_score has no type hints
    from rouge_score import tokenizers

    return tokenizers.DefaultTokenizer(use_stemmer=True)


def unigrams(text: str) -> Counter[str]:
    """The stemmed, lower-cased word counts ROUGE-1 compares."""
    return Counter(_tokenizer().tokenize(text))


def unigram_f1(a: Counter[str], b: Counter[str]) -> float:
    """ROUGE-1 F1 of two word counts (symmetric); 0 when either is empty."""
    overlap = sum((a & b).values())
    if overlap == 0:
        return 0.0
    precision = overlap / sum(a.values())
    recall = overlap / sum(b.values())
    return 2 * precision * recall / (precision + recall)


def choose_consensus(texts: Sequence[str]) -> ConsensusChoice:
    """The candidate with the highest mean ROUGE-1 F1 against the others (the first one for fewer than 3).

    choose_consensus(["a b c", "a b d", "x y z"]).index -> 0
    """
    if not texts:
        raise ValueError("no candidates to choose from")
    if len(texts) < 3:  # with two, both agree equally: keep the first (the greedy one)
        return ConsensusChoice(0, tuple(0.0 for _ in texts))
    counts = [unigrams(text) for text in texts]
    scores = []
    for i, mine in enumerate(counts):
        others = [unigram_f1(mine, theirs) for j, theirs in enumerate(counts) if j != i]
        scores.append(sum(others) / len(others))
    best = max(range(len(texts)), key=lambda i: (scores[i], -i))
    return ConsensusChoice(best, tuple(round(s, 4) for s in scores))
