"""The benchmark's statistics: report.md's significance star, the bootstrap intervals' tails, the ratio
interval's dropped infinities, `Interval.excludes_zero`, the pairing check in `deltas`, the seed of
`mean_interval`, the gold perplexity's token weights and the gold delta's sign.

Each case is a mutation of localpers/bench/ (report.py, metrics.py, results.py) that the rest of the suite
let through, found by mutation audits in the eighty-eighth and eighty-ninth sessions; each test fails with its
mutation applied.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from localpers.bench.metrics import Interval, mean_interval, paired_bootstrap, paired_ratio_bootstrap
from localpers.bench.report import _interval
from localpers.bench.results import _gold_summary, deltas


@pytest.mark.parametrize(
    ("iv", "null", "starred"),
    [
        ([0.1, 0.2, 0.3], 0.0, True),
        ([-0.3, -0.2, -0.1], 0.0, True),  # wholly below the null: starred too (`or`, not `and`)
        ([-0.1, 0.0, 0.1], 0.0, False),
        ([0.9, 1.0, 1.1], 1.0, False),  # a ratio straddling 1, though it lies wholly above 0
        ([1.05, 1.1, 1.2], 1.0, True),
    ],
)
def test_report_interval_stars_only_an_interval_that_excludes_its_null(
    iv: list[float], null: float, starred: bool
) -> None:
    assert _interval(iv, null=null).endswith(" *") is starred


def test_paired_bootstrap_default_interval_is_95_percent_two_sided() -> None:
    # Resampled means of [0, 0, 0, 1] are k/4; P(mean >= 0.75) = 13/256 ~ 5.1% puts 0.75 above the 97.5th
    # percentile, while a one-sided 5% tail (a 90% interval) would stop at 0.5.
    interval = paired_bootstrap([0, 0, 0, 1], [0, 0, 0, 0], n_resamples=4000)
    assert (interval.low, interval.mean, interval.high) == pytest.approx((0.0, 0.25, 0.75))


def test_paired_ratio_bootstrap_drops_resamples_with_a_zero_baseline() -> None:
    # Most resamples of the baseline [0, 0, 0, .5] miss its one nonzero value (a ratio of inf or nan);
    # kept, they would make the interval NaN and results.json would hold null.
    interval = paired_ratio_bootstrap([0.2, 0.3, 0.1, 0.4], [0.0, 0.0, 0.0, 0.5])
    bounds = interval.as_list()
    assert bounds is not None
    assert bounds == pytest.approx([0.8667, 2.0, 2.4], abs=1e-3)


@pytest.mark.parametrize(
    ("interval", "excludes"),
    [
        (Interval(-0.3, -0.2, -0.1), True),
        (Interval(-0.1, 0.0, 0.1), False),
        (Interval(0.1, 0.2, 0.3), True),
    ],
)
def test_interval_excludes_zero_on_either_side(interval: Interval, excludes: bool) -> None:
    assert interval.excludes_zero() is excludes


def _records(query_ids: list[str], score: float) -> list[dict[str, Any]]:
    """One user's records as the runner writes them, one query per id, every query scoring `score`."""
    queries = [{"query_id": qid, "rouge1": score, "rougeL": score} for qid in query_ids]
    return [{"user": "u1", "queries": queries}]


def test_deltas_refuses_records_scored_on_different_queries() -> None:
    with pytest.raises(ValueError, match="different \\(user, query\\) pairs"):
        deltas(_records(["q1", "q2"], 0.5), _records(["q1", "q3"], 0.4), n_resamples=100, seed=0)


def test_mean_interval_follows_its_seed() -> None:
    values = [0.11, 0.52, 0.23, 0.94, 0.37, 0.68, 0.45, 0.05, 0.81, 0.29]

    def bounds(seed: int) -> tuple[float, float]:
        interval = mean_interval(values, n_resamples=1000, seed=seed)
        return interval.low, interval.high

    assert bounds(1) == bounds(1)
    assert bounds(1) != bounds(2)


def test_gold_perplexity_weighs_each_query_by_its_reference_tokens() -> None:
    # -1 nat/token over 1 token and -3 over 3: per query the mean is -2, over all 4 tokens it is -10/4 = -2.5
    queries = [
        {"gold_logprob": -1.0, "gold_tokens": 1},
        {"gold_logprob": -3.0, "gold_tokens": 3},
    ]
    summary = _gold_summary(queries, n_resamples=100, seed=0)
    assert summary["gold_logprob"] == pytest.approx(-2.0)
    assert summary["gold_perplexity"] == pytest.approx(math.exp(2.5), abs=1e-3)


def test_gold_delta_is_the_candidate_minus_the_baseline() -> None:
    candidate = [
        {
            "user": "u1",
            "queries": [dict(q, gold_logprob=-1.0) for q in _records(["a", "b"], 0.5)[0]["queries"]],
        }
    ]
    baseline = [
        {
            "user": "u1",
            "queries": [dict(q, gold_logprob=-1.5) for q in _records(["a", "b"], 0.5)[0]["queries"]],
        }
    ]
    low, mean, high = deltas(candidate, baseline, n_resamples=100, seed=0)["gold_logprob"]
    assert (low, mean, high) == pytest.approx((0.5, 0.5, 0.5))
