"""The product's targets judged on results.json objects (`localpers.bench.targets`), and the report table."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from localpers.bench.report import render_report
from localpers.bench.targets import check_targets, targets_summary


def _row(**overrides: Any) -> dict[str, Any]:
    row = {
        "rouge1": 0.2,
        "rougeL": 0.18,
        "n": 30,
        "ms_per_token": 10.0,
        "rewrite_ms": 300.0,
        "prompt_ms": 140.0,
        "tokens_per_output": 16.0,
        "fit_s_per_user": 6.0,
        "fit_shared_negatives": False,
        "bytes_per_user": 5000,
        "params": {"history": None},
        "overrides": {},
    }
    return {**row, **overrides}


def _results(history_limit: int | None = 20) -> dict[str, Any]:
    """A run where the default meets every target."""
    return {
        "methods": {
            "global": _row(base="global", rouge1=0.15),
            "global-history": _row(base="global-history", rouge1=0.19, ms_per_token=10.1, rewrite_ms=340.0),
            "card-auto": _row(base="card-auto", ms_per_token=10.5, rewrite_ms=350.0),
        },
        "deltas_vs_global": {
            "card-auto": {
                "rouge1": [0.02, 0.05, 0.08],
                "rouge1_ratio": [1.12, 1.33, 1.55],
                "gold_logprob": [0.05, 0.1, 0.15],
            }
        },
        "authors_vs_global": {
            "card-auto": {
                "authors": 15,
                "improved": 10,
                "unchanged": 1,
                "worse": 4,
                "rouge1_ratio": [1.05, 1.3, 1.6],
                "rouge1": [0.01, 0.05, 0.09],
            }
        },
        "config": {
            "history_limit": history_limit,
            "data": "d.jsonl",
            "n_users": 15,
            "n_queries": 30,
            "data_sha256": "0" * 64,
            "bundle": "b",
            "bundle_sha256": "1" * 64,
            "backbone": "m.gguf",
            "head": "h",
            "bootstrap_resamples": 1000,
            "seed": 0,
        },
    }


def _met(results: dict[str, Any]) -> list[bool | None]:
    return [check.met for check in check_targets(results)]


def test_a_run_meeting_every_target_says_so() -> None:
    checks = check_targets(_results())
    assert [check.met for check in checks] == [True] * 7
    assert targets_summary(checks) == "7 met, 0 not met"
    assert "10/15 (67%, 1 unchanged)" in checks[1].measured  # exactly 2/3 counts as met
    assert checks[3].measured.startswith("1.05x")
    assert checks[4].measured.startswith("1.17x")


@pytest.mark.parametrize(
    ("index", "change"),
    [
        (0, lambda r: r["deltas_vs_global"]["card-auto"].update(rouge1_ratio=[1.0, 1.2, 1.4])),
        (0, lambda r: r["deltas_vs_global"]["card-auto"].update(rouge1=[-0.01, 0.05, 0.1])),
        (1, lambda r: r["authors_vs_global"]["card-auto"].update(improved=9)),
        (2, lambda r: r["deltas_vs_global"]["card-auto"].update(gold_logprob=[-0.01, 0.1, 0.2])),
        (3, lambda r: r["methods"]["card-auto"].update(ms_per_token=11.5)),
        (4, lambda r: r["methods"]["card-auto"].update(rewrite_ms=400.0)),
        (5, lambda r: r["methods"]["card-auto"].update(bytes_per_user=10_001)),
        # one user far over the limit, the mean within it: judged on the largest (bench audit, s87)
        (5, lambda r: r["methods"]["card-auto"].update(bytes_per_user=5_000, max_bytes_per_user=12_000)),
        (6, lambda r: r["methods"]["card-auto"].update(fit_s_per_user=10.5)),
    ],
)
def test_each_target_can_fail_alone(index: int, change: Any) -> None:
    results = _results()
    change(results)
    met = _met(results)
    assert met[index] is False
    assert met[:index] + met[index + 1 :] == [True] * 6
    checks = check_targets(results)
    assert targets_summary(checks) == f"6 met, 1 not met ({checks[index].name})"


def test_what_the_run_cannot_judge_is_not_judged() -> None:
    results = _results(history_limit=None)  # fitted on whole histories, not on 20 items
    assert _met(results)[6] is None
    assert "--history-limit 20" in check_targets(results)[6].measured
    shared = _results()
    shared["methods"]["card-auto"]["fit_shared_negatives"] = True
    assert _met(shared)[6] is None
    no_gold = _results()
    del no_gold["deltas_vs_global"]["card-auto"]["gold_logprob"]
    assert _met(no_gold)[2] is None
    assert targets_summary(check_targets(no_gold)) == "6 met, 0 not met, 1 not judged"
    # a resumed run whose timings mix thread counts (its own note says so) judged the costs anyway (audit85)
    mixed = _results()
    mixed["config"]["run_notes"] = [
        "timings mix llama.cpp thread counts (3 with 2 threads, 1 with 4 threads ...)"
    ]
    assert _met(mixed)[3] is None and _met(mixed)[4] is None
    assert "not judged: the timings mix thread counts" in check_targets(mixed)[3].measured


def test_a_ratio_to_a_global_scoring_zero_is_not_judged() -> None:
    results = _results()
    results["deltas_vs_global"]["card-auto"]["rouge1_ratio"] = None  # global's mean R-1 was 0
    check = check_targets(results)[0]
    assert check.met is None and check.measured == "undefined: global's mean ROUGE-1 is 0"


@pytest.mark.parametrize(
    ("candidate", "baseline", "authors"),
    [
        ([0.3, 0.2], [0.1, 0.2], ["ann", "ann"]),  # one author: no interval over authors
        ([0.3, 0.2], [0.0, 0.0], ["ann", "bob"]),  # global scores 0: no ratio
    ],
)
def test_an_undefined_author_ratio_is_not_judged_and_the_report_renders(
    candidate: list[float], baseline: list[float], authors: list[str]
) -> None:
    from localpers.bench.authors import compare_authors

    results = _results()
    compared = compare_authors(candidate, baseline, authors, n_resamples=100).as_dict()
    assert compared["rouge1_ratio"] is None
    results["authors_vs_global"]["card-auto"] = compared
    checks = check_targets(results)
    assert checks[1].met is None
    assert checks[1].measured.endswith("undefined: one author, or global's mean ROUGE-1 is 0")
    results["targets"] = {
        "method": "card-auto",
        "summary": targets_summary(checks),
        "checks": [c.as_dict() for c in checks],
    }
    assert "2/3 of the authors improved" in render_report(results)


def test_no_targets_without_the_default_method_or_the_baseline() -> None:
    results = _results()
    del results["methods"]["card-auto"]
    assert check_targets(results) == []
    results = _results()
    del results["methods"]["global"]
    assert check_targets(results) == []
    assert check_targets(_results(), method="card@strength=0.5") == []


def test_report_shows_the_targets_section() -> None:
    from localpers.bench.targets import DEFAULT_METHOD

    results = _results()
    checks = check_targets(results)
    checks_dicts = [check.as_dict() for check in checks]
    results["targets"] = {
        "method": DEFAULT_METHOD,
        "summary": targets_summary(checks),
        "checks": checks_dicts,
    }
    results["deltas_vs_global"]["global-history"] = copy.deepcopy(results["deltas_vs_global"]["card-auto"])
    text = render_report(results)
    assert "## Targets: `card-auto` (the default) against global" in text
    assert "7 met, 0 not met." in text
    assert text.count("| **met** |") == 7
    del results["targets"]
    assert "## Targets" not in render_report(results)


def test_a_one_query_run_judges_nothing_by_interval_and_stars_nothing() -> None:
    from localpers.bench.results import deltas

    def records(score: float) -> list[dict[str, Any]]:
        query = {"query_id": "q1", "rouge1": score, "rougeL": score, "gold_logprob": -score}
        return [{"user": "ann", "queries": [query]}]

    one = deltas(records(0.5), records(0.2), n_resamples=100, seed=0)
    assert one["rouge1"] is None and one["rouge1_ratio"] is None and one["gold_logprob"] is None
    results = _results()
    results["deltas_vs_global"]["card-auto"] = one
    checks = check_targets(results)
    assert checks[0].met is None and checks[0].measured == "no interval: fewer than 2 paired queries"
    assert checks[2].met is None
    main_table = render_report(results).split("\n\n")[3]
    assert "| card-auto |" in main_table and "*" not in main_table
