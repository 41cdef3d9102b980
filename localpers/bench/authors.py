"""Author-level figures of a benchmark: each author's mean ROUGE-1 under two methods, how many authors the
candidate improves, and bootstrap intervals that resample authors, each with all of their queries.

    compare_authors([0.3, 0.1, 0.2], [0.2, 0.1, 0.1], ["ann", "ann", "bob"], n_resamples=1000)
    -> AuthorComparison(improved=2, unchanged=0, worse=0, ratio=Interval(..., mean=1.5, ...), ...)

The design notes (`../shared/DESIGN.md`) section 7 ask for these beside the query-level interval: gains
concentrate in a few authors, so an interval over queries alone overstates how sure a result is. An author counts as improved when the candidate's
mean over their queries is higher than the baseline's, unchanged when it is equal (the same outputs, usually).
`localpers bench` (results.json, report.md, authors.png) and `scripts/compare_runs.py` both use this module.
Pure numpy: it reads no files, scores nothing and draws nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from localpers.bench.metrics import DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES, MIN_PAIRS_FOR_INTERVAL, Interval


@dataclass(frozen=True)
class AuthorScore:
    """One author's mean score over their queries under the candidate and the baseline."""

    author: str
    queries: int
    candidate: float
    baseline: float

    @property
    def ratio(self) -> float:
        """candidate / baseline, nan when the baseline scored 0 on every query of the author."""
        return self.candidate / self.baseline if self.baseline > 0 else math.nan


@dataclass(frozen=True)
class AuthorComparison:
    """The candidate against the baseline, author by author."""

    authors: tuple[AuthorScore, ...]
    improved: int
    unchanged: int
    worse: int
    ratio: Interval  # mean over all queries, candidate / baseline; interval over resampled authors
    difference: Interval  # mean over all queries of candidate - baseline; the same resamples

    def improved_text(self) -> str:
        return improved_text(self.improved, len(self.authors), self.unchanged)

    def as_dict(self, digits: int = 5) -> dict[str, Any]:
        """The results.json form (intervals as [low, mean, high])."""
        return {
            "authors": len(self.authors),
            "improved": self.improved,
            "unchanged": self.unchanged,
            "worse": self.worse,
            "rouge1_ratio": self.ratio.as_list(digits),
            "rouge1": self.difference.as_list(digits),
        }


def improved_text(improved: int, authors: int, unchanged: int = 0) -> str:
    """ "9/15", or "9/15 (2 unchanged)"."""
    return f"{improved}/{authors}" + (f" ({unchanged} unchanged)" if unchanged else "")


def compare_authors(
    candidate: Sequence[float],
    baseline: Sequence[float],
    authors: Sequence[str],
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    rng: np.random.Generator | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
) -> AuthorComparison:
    """Paired per-query scores of two methods, with each query's author, compared author by author.

    Each resample draws as many authors as there are, with replacement (authors sorted by name, so the draws
    do not depend on the queries' order); a drawn author brings all their queries, and the resample's
    ratio and difference are taken over those queries. `rng` (a numpy Generator) overrides `seed` when a
    caller needs its own stream of draws.
    """
    a = np.asarray(candidate, dtype=np.float64)
    b = np.asarray(baseline, dtype=np.float64)
    labels = np.asarray([str(author) for author in authors])
    if a.shape != b.shape or a.ndim != 1 or labels.shape != a.shape:
        raise ValueError(
            f"need one candidate score, one baseline score and one author per query; got {a.shape}, "
            f"{b.shape} and {labels.shape}"
        )
    if a.size == 0:
        raise ValueError("no queries to compare")
    names, index = np.unique(labels, return_inverse=True)
    counts = np.bincount(index, minlength=len(names)).astype(np.float64)
    sums_a = np.bincount(index, weights=a, minlength=len(names))
    sums_b = np.bincount(index, weights=b, minlength=len(names))
    scores = tuple(
        AuthorScore(str(name), int(count), float(sum_a / count), float(sum_b / count))
        for name, count, sum_a, sum_b in zip(names, counts, sums_a, sums_b, strict=True)
    )
    means_a = sums_a / counts
    means_b = sums_b / counts

    draws = (rng or np.random.default_rng(seed)).integers(0, len(names), size=(n_resamples, len(names)))
    drawn_a, drawn_b, drawn_n = sums_a[draws].sum(1), sums_b[draws].sum(1), counts[draws].sum(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = drawn_a / drawn_b
    tail = 100 * (1 - confidence) / 2
    ratio = Interval(math.nan, math.nan, math.nan)
    if b.sum() > 0:
        finite = ratios[np.isfinite(ratios)]
        low, high = np.percentile(finite, [tail, 100 - tail])
        ratio = Interval(float(low), float(a.mean() / b.mean()), float(high))
    low, high = np.percentile((drawn_a - drawn_b) / drawn_n, [tail, 100 - tail])
    # one author: every resample is that author, a zero-width interval that would look significant
    if len(names) < MIN_PAIRS_FOR_INTERVAL:
        ratio, low, high = Interval(math.nan, ratio.mean, math.nan), math.nan, math.nan
    return AuthorComparison(
        authors=scores,
        improved=int((means_a > means_b).sum()),
        unchanged=int((means_a == means_b).sum()),
        worse=int((means_a < means_b).sum()),
        ratio=ratio,
        difference=Interval(float(low), float((a - b).mean()), float(high)),
    )
