"""Author-level figures (`localpers.bench.authors`) against hand-computed cases and a brute-force bootstrap."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localpers.bench.authors import compare_authors, improved_text

# ann: two queries, 0.4 vs 0.3 in all (improved); bob: one query, 0.2 vs 0.1 (improved);
# cid: one query, 0.1 vs 0.1 (unchanged); dee: one query, 0.0 vs 0.2 (worse).
CANDIDATE = [0.3, 0.1, 0.2, 0.1, 0.0]
BASELINE = [0.2, 0.1, 0.1, 0.1, 0.2]
AUTHORS = ["ann", "ann", "bob", "cid", "dee"]


def test_counts_and_means_by_author() -> None:
    result = compare_authors(CANDIDATE, BASELINE, AUTHORS, n_resamples=200)
    assert (result.improved, result.unchanged, result.worse) == (2, 1, 1)
    assert result.improved_text() == "2/4 (1 unchanged)"
    by_name = {score.author: score for score in result.authors}
    assert by_name["ann"].queries == 2
    assert by_name["ann"].candidate == pytest.approx(0.2) and by_name["ann"].baseline == pytest.approx(0.15)
    assert by_name["dee"].ratio == 0.0
    # the point estimates are over all queries, as the query-level figures are
    assert result.ratio.mean == pytest.approx(0.7 / 0.7)
    assert result.difference.mean == pytest.approx(0.0, abs=1e-12)


def test_one_author_gives_no_interval_where_a_query_bootstrap_would() -> None:
    # Resampling authors: every draw is the same author with all of their queries, a zero-width interval that
    # would mark any difference as significant; there is none (NaN bounds, null in results.json).
    result = compare_authors([0.5, 0.1, 0.3], [0.1, 0.4, 0.2], ["ann"] * 3, n_resamples=500)
    assert result.ratio.mean == pytest.approx(0.9 / 0.7) and result.difference.mean == pytest.approx(0.2 / 3)
    assert result.ratio.as_list() is None and result.difference.as_list() is None
    assert result.as_dict()["rouge1_ratio"] is None


def test_matches_a_brute_force_author_bootstrap() -> None:
    rng = np.random.default_rng(3)
    authors = [f"a{i:02d}" for i in rng.integers(0, 12, size=90)]
    candidate = rng.uniform(0, 0.5, size=90)
    baseline = rng.uniform(0, 0.5, size=90)
    result = compare_authors(candidate, baseline, authors, n_resamples=400, seed=7)

    names = sorted(set(authors))
    members = [np.flatnonzero(np.array(authors) == name) for name in names]
    draws = np.random.default_rng(7)
    ratios, differences = [], []
    for _ in range(400):
        chosen = np.concatenate([members[i] for i in draws.integers(0, len(names), size=len(names))])
        ratios.append(candidate[chosen].mean() / baseline[chosen].mean())
        differences.append((candidate - baseline)[chosen].mean())
    assert [result.ratio.low, result.ratio.high] == pytest.approx(np.percentile(ratios, [2.5, 97.5]))
    assert [result.difference.low, result.difference.high] == pytest.approx(
        np.percentile(differences, [2.5, 97.5])
    )
    improved = sum(candidate[m].mean() > baseline[m].mean() for m in members)
    assert result.improved == improved


def test_same_seed_same_interval_and_query_order_does_not_matter() -> None:
    first = compare_authors(CANDIDATE, BASELINE, AUTHORS, n_resamples=300, seed=1)
    order = [4, 2, 0, 3, 1]
    shuffled = compare_authors(
        [CANDIDATE[i] for i in order],
        [BASELINE[i] for i in order],
        [AUTHORS[i] for i in order],
        n_resamples=300,
        seed=1,
    )
    for a, b in ((first.ratio, shuffled.ratio), (first.difference, shuffled.difference)):
        assert [a.low, a.mean, a.high] == pytest.approx([b.low, b.mean, b.high], abs=1e-12)
    assert compare_authors(CANDIDATE, BASELINE, AUTHORS, n_resamples=300, seed=2).ratio != first.ratio


def test_a_baseline_of_zero_everywhere_has_no_ratio() -> None:
    result = compare_authors([0.1, 0.2], [0.0, 0.0], ["ann", "bob"], n_resamples=100)
    assert math.isnan(result.ratio.mean) and math.isnan(result.ratio.low)
    assert result.improved == 2 and result.difference.mean == pytest.approx(0.15)


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="one author per query"):
        compare_authors([0.1, 0.2], [0.1, 0.2], ["ann"])
    with pytest.raises(ValueError, match="no queries"):
        compare_authors([], [], [])


def test_improved_text() -> None:
    assert improved_text(9, 15) == "9/15"
    assert improved_text(9, 15, 2) == "9/15 (2 unchanged)"


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("abcde"), st.floats(0, 1), st.floats(0.01, 1)), min_size=1, max_size=30
    )
)
def test_counts_add_up_and_intervals_are_ordered(rows: list[tuple[str, float, float]]) -> None:
    authors, candidate, baseline = zip(*rows, strict=True)
    result = compare_authors(candidate, baseline, authors, n_resamples=200)
    assert result.improved + result.unchanged + result.worse == len(set(authors)) == len(result.authors)
    assert sum(score.queries for score in result.authors) == len(rows)
    if len(set(authors)) == 1:  # one author: no interval
        assert result.difference.as_list() is None and result.ratio.as_list() is None
    else:
        assert result.difference.low <= result.difference.high
        assert result.ratio.low <= result.ratio.high
    assert result.ratio.mean == pytest.approx(sum(candidate) / sum(baseline))
