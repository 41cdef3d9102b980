"""ROUGE, paired bootstrap and BM25 helpers against hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from localpers.bench.metrics import mean_interval, paired_bootstrap, paired_ratio_bootstrap, rouge, scorable
from localpers.users.retrieval import Bm25Index, words


def test_rouge_subset_prediction() -> None:
    # 3 of 3 predicted unigrams match (P = 1), 3 of 6 reference unigrams are covered (R = 0.5):
    # F1 = 2 * 1 * 0.5 / 1.5 = 2/3; the LCS is "the cat sat", also 3 tokens.
    scores = rouge("the cat sat", "the cat sat on the mat")
    assert scores.rouge1 == pytest.approx(2 / 3)
    assert scores.rougeL == pytest.approx(2 / 3)


def test_rouge_order_matters_only_for_rouge_l() -> None:
    # Same bag of words: R-1 = 1; the longest common subsequence of reversed sequences is 1 token,
    # so P = R = 1/4 for R-L.
    scores = rouge("a b c d", "d c b a")
    assert scores.rouge1 == pytest.approx(1.0)
    assert scores.rougeL == pytest.approx(0.25)


def test_rouge_stems_and_ignores_case() -> None:
    # Porter stemming: running -> run, dogs -> dog; case is folded.
    assert rouge("Running Dogs", "run dog").rouge1 == pytest.approx(1.0)


def test_rouge_partial_overlap() -> None:
    # prediction "big storm hits city" (4), reference "storm hits the coast" (4): overlap storm, hits = 2,
    # P = R = 0.5, F1 = 0.5; LCS "storm hits" = 2 -> R-L 0.5 too.
    scores = rouge("big storm hits city", "storm hits the coast")
    assert scores.rouge1 == pytest.approx(0.5)
    assert scores.rougeL == pytest.approx(0.5)


def test_rouge_empty_prediction_scores_zero() -> None:
    scores = rouge("", "anything at all")
    assert (scores.rouge1, scores.rougeL) == (0.0, 0.0)
    assert rouge("anything at all", "").rouge1 == 0.0  # an empty reference too


def test_bootstrap_of_a_constant_difference_is_that_constant() -> None:
    interval = paired_bootstrap([0.2, 0.4, 0.6], [0.1, 0.3, 0.5], n_resamples=500)
    assert interval.as_list() == pytest.approx([0.1, 0.1, 0.1])
    assert interval.excludes_zero()


def test_bootstrap_of_identical_methods_is_zero() -> None:
    interval = paired_bootstrap([0.3, 0.1, 0.7], [0.3, 0.1, 0.7], n_resamples=500)
    assert interval.as_list() == [0.0, 0.0, 0.0]
    assert not interval.excludes_zero()


def test_bootstrap_two_queries_by_hand() -> None:
    # Differences [0, 1]: a resample of two has mean 0 (p = 1/4), 0.5 (p = 1/2) or 1 (p = 1/4),
    # so the 2.5th percentile is 0, the 97.5th is 1, and the point estimate is 0.5.
    interval = paired_bootstrap([0.5, 1.0], [0.5, 0.0], n_resamples=4000, seed=3)
    assert interval.as_list() == [0.0, 0.5, 1.0]
    assert not interval.excludes_zero()


def test_bootstrap_interval_narrows_with_more_queries() -> None:
    rng = np.random.default_rng(0)
    small = rng.normal(0.05, 0.2, 20)
    large = rng.normal(0.05, 0.2, 2000)
    width_small = np.ptp(paired_bootstrap(small, np.zeros(20), n_resamples=2000).as_list())
    width_large = np.ptp(paired_bootstrap(large, np.zeros(2000), n_resamples=2000).as_list())
    assert width_large < width_small / 5  # ~ sqrt(100) = 10 in theory


def test_bootstrap_is_paired_not_independent() -> None:
    # Both methods vary a lot across queries but the second is always 0.01 better: pairing removes
    # the between-query variance, so the interval is exactly [0.01, 0.01].
    baseline = np.linspace(0.0, 0.9, 10)
    interval = paired_bootstrap(baseline + 0.01, baseline, n_resamples=1000)
    assert interval.low == pytest.approx(0.01) and interval.high == pytest.approx(0.01)


def test_ratio_bootstrap_point_and_bounds() -> None:
    interval = paired_ratio_bootstrap([0.3, 0.3], [0.2, 0.2], n_resamples=200)
    assert interval.as_list() == pytest.approx([1.5, 1.5, 1.5])
    zero = paired_ratio_bootstrap([0.3], [0.0], n_resamples=200)
    assert math.isnan(zero.mean)


def test_mean_interval_by_hand() -> None:
    interval = mean_interval([0.0, 1.0], n_resamples=4000, seed=1)
    assert interval.as_list() == [0.0, 0.5, 1.0]


def test_bootstrap_rejects_unpaired_input() -> None:
    with pytest.raises(ValueError, match="one length"):
        paired_bootstrap([0.1, 0.2], [0.1])
    with pytest.raises(ValueError, match="no paired"):
        paired_bootstrap([], [])


def test_bm25_ranks_the_matching_document_first() -> None:
    index = Bm25Index(["cats purr softly", "dogs bark loudly", "fish swim", "birds sing"])
    assert index.top("why do cats purr", 1) == [0]
    assert index.top("loud dogs bark", 2)[0] == 1
    assert sorted(index.top("anything", 10)) == [0, 1, 2, 3]  # fewer documents than k: all of them


def test_words_splits_and_lowercases() -> None:
    assert words("Don't STOP-now 2024") == ["don", "t", "stop", "now", "2024"]


def test_words_rouge_cannot_count_are_found() -> None:
    assert scorable("Hello, world") and scorable("Élections 2024")
    assert not scorable("北京推出新交通政策") and not scorable("— !")
    assert rouge("北京推出新交通政策", "北京推出新交通政策").rouge1 == 0.0  # why a note is needed


def test_an_undefined_ratio_is_none_not_nan() -> None:
    ratio = paired_ratio_bootstrap([0.2, 0.1], [0.0, 0.0], n_resamples=100)
    assert math.isnan(ratio.mean) and ratio.as_list() is None
    assert paired_ratio_bootstrap([0.2, 0.1], [0.1, 0.1], n_resamples=100).as_list() is not None


def test_results_json_never_holds_nan(tmp_path) -> None:  # noqa: ANN001
    import json

    from localpers.bench.results import write_results

    path = tmp_path / "results.json"
    write_results({"a": [float("nan"), 1.0, {"b": float("inf")}], "c": (0.5, float("-inf"))}, path)
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"a": [None, 1.0, {"b": None}], "c": [0.5, None]}


def test_one_pair_gives_no_interval_rather_than_a_significant_zero_width_one() -> None:
    single = paired_bootstrap([0.5], [0.2], n_resamples=200)
    assert single.mean == pytest.approx(0.3) and single.as_list() is None and not single.excludes_zero()
    ratio = paired_ratio_bootstrap([0.5], [0.25], n_resamples=200)
    assert ratio.mean == pytest.approx(2.0) and ratio.as_list() is None
    assert paired_bootstrap([0.5, 0.6], [0.2, 0.3], n_resamples=200).as_list() is not None  # two are enough


def test_ratio_interval_is_undefined_when_every_resample_has_a_zero_baseline() -> None:
    """With baseline [1, 0], a resample that draws the second pair twice has a zero baseline; seed 0's single
    resample does, so no ratio is defined: NaN bounds and the point ratio, not an IndexError."""
    ratio = paired_ratio_bootstrap([1.0, 1.0], [1.0, 0.0], n_resamples=1, seed=0)
    assert ratio.mean == pytest.approx(2.0) and ratio.as_list() is None
