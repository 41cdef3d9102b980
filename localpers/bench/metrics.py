"""Scores for the benchmark: ROUGE-1/ROUGE-L F1 (rouge-score, Porter stemming) and paired bootstraps.

    rouge("the cat sat", "the cat sat on the mat") -> Rouge(rouge1=0.667, rougeL=0.667)

`paired_bootstrap` resamples queries (with replacement) and recomputes the mean difference between
two methods on the same queries; the interval is the percentile interval. This module holds no
state and knows nothing of models or files.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_RESAMPLES = 10_000
DEFAULT_CONFIDENCE = 0.95
MIN_PAIRS_FOR_INTERVAL = 2  # paired intervals of fewer queries (or authors) are not defined


@dataclass(frozen=True)
class Rouge:
    """F1 scores in [0, 1]."""

    rouge1: float
    rougeL: float  # noqa: N815 - the metric's conventional name, as in results.json


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap percentile interval."""

    low: float
    mean: float
    high: float

    def as_list(self, digits: int = 5) -> list[float] | None:
        """[low, mean, high] rounded; None when the figure is undefined (a ratio to a mean of 0), so that
        results.json holds null, which every JSON reader takes, instead of NaN."""
        values = (self.low, self.mean, self.high)
        if not all(np.isfinite(values)):
            return None
        return [round(value, digits) for value in values]

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


@functools.lru_cache(maxsize=1)
def _scorer():  # noqa: ANN202 - rouge_score has no type hints
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)


@functools.lru_cache(maxsize=1)
def _tokenizer():  # noqa: ANN202
    from rouge_score import tokenizers

    return tokenizers.DefaultTokenizer(use_stemmer=False)


def scorable(text: str) -> bool:
    """Whether ROUGE can count any word of `text`: rouge-score keeps only the letters a-z and digits 0-9
    (after lowercasing), so a reference written in another script scores 0 against anything, itself included.

    scorable("Hello, world") -> True;  scorable("北京推出新政策") -> False
    """
    return bool(_tokenizer().tokenize(text))


def rouge(prediction: str, reference: str) -> Rouge:
    """ROUGE-1 and ROUGE-L F1 of `prediction` against `reference` (stemmed, case-insensitive)."""
    scores = _scorer().score(reference, prediction)
    return Rouge(float(scores["rouge1"].fmeasure), float(scores["rougeL"].fmeasure))


def _resample_indices(n: int, n_resamples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))


def _bounds(samples: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def paired_bootstrap(
    candidate: Sequence[float],
    baseline: Sequence[float],
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Interval:
    """Mean of `candidate - baseline` (paired by position) with its bootstrap interval.

    paired_bootstrap([0.2, 0.4], [0.1, 0.3]) -> Interval(low=0.1, mean=0.1, high=0.1)

    One pair gives no interval (NaN bounds; `as_list` is None): resampling it returns it every time, a
    zero-width interval that would mark any difference as significant.
    """
    a, b = _paired_arrays(candidate, baseline)
    differences = a - b
    if len(differences) < MIN_PAIRS_FOR_INTERVAL:
        return Interval(math.nan, float(differences.mean()), math.nan)
    indices = _resample_indices(len(differences), n_resamples, seed)
    low, high = _bounds(differences[indices].mean(axis=1), confidence)
    return Interval(low, float(differences.mean()), high)


def paired_ratio_bootstrap(
    candidate: Sequence[float],
    baseline: Sequence[float],
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Interval:
    """`mean(candidate) / mean(baseline)` with a paired bootstrap interval (nan if the baseline is 0; NaN bounds
    where fewer than two pairs, or no resample with a nonzero baseline, define one)."""
    a, b = _paired_arrays(candidate, baseline)
    if b.mean() == 0:
        return Interval(float("nan"), float("nan"), float("nan"))
    if len(a) < MIN_PAIRS_FOR_INTERVAL:  # as in `paired_bootstrap`
        return Interval(math.nan, float(a.mean() / b.mean()), math.nan)
    indices = _resample_indices(len(a), n_resamples, seed)
    resampled_baseline = b[indices].mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = a[indices].mean(axis=1) / resampled_baseline
    finite = ratios[np.isfinite(ratios)]
    if finite.size == 0:  # every resample drew only zero-baseline pairs (a handful of resamples can)
        return Interval(math.nan, float(a.mean() / b.mean()), math.nan)
    low, high = _bounds(finite, confidence)
    return Interval(low, float(a.mean() / b.mean()), high)


def mean_interval(
    values: Sequence[float],
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Interval:
    """The mean of `values` with its bootstrap interval."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no values to bootstrap")
    indices = _resample_indices(len(x), n_resamples, seed)
    low, high = _bounds(x[indices].mean(axis=1), confidence)
    return Interval(low, float(x.mean()), high)


def _paired_arrays(candidate: Sequence[float], baseline: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(candidate, dtype=np.float64)
    b = np.asarray(baseline, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired scores must be two 1-D arrays of one length, got {a.shape} and {b.shape}")
    if a.size == 0:
        raise ValueError("no paired scores to bootstrap")
    return a, b
