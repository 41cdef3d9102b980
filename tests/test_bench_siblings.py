"""`localpers.bench.siblings` and `scripts/gain_by_sibling.py`: a run's gain split by the closest earlier headline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from localpers.bench.data import BenchQuery, BenchUser
from localpers.bench.siblings import (
    bin_index,
    bin_names,
    gain_by_sibling,
    share_needed,
    sibling_score,
    sibling_summary,
)
from localpers.users.history import HistoryItem

SCRIPT = Path(__file__).parent.parent / "scripts" / "gain_by_sibling.py"
PROMPT = "Generate a headline for the following article: "


def item(number: int, headline: str) -> dict[str, str]:
    return {"id": f"n{number}", "input": f"{PROMPT}article number {number}", "output": headline}


HISTORY = [item(1, "What To Watch On Netflix This Week"), item(2, "Council Backs Tramway Budget")]
QUERIES = [item(3, "What To Watch On Netflix This Week"), item(4, "Markets Slide Sharply")]


def test_sibling_score_is_the_best_earlier_headline() -> None:
    earlier = [h["output"] for h in HISTORY]
    assert sibling_score(earlier, "What To Watch On Netflix This Week") == pytest.approx(1.0)
    assert sibling_score(earlier, "Markets Slide Sharply") == 0.0
    assert sibling_score([], "Anything") == 0.0


def test_bins_are_closed_below() -> None:
    assert bin_names() == ["< 0.3", "0.3-0.5", ">= 0.5"]
    assert [bin_index(s) for s in (0.0, 0.29, 0.3, 0.49, 0.5, 1.0)] == [0, 0, 1, 1, 2, 2]


def test_share_needed_solves_for_the_top_bin() -> None:
    base, method = np.array([0.2, 0.2]), np.array([0.2, 0.4])
    # ratio = ((1 - s) 0.2 + s 0.4) / 0.2 = 1 + s: 1.25x needs a quarter of the queries in the top bin
    assert share_needed(base, method, np.array([0.9, 0.1]), 1.25) == pytest.approx(0.25)
    assert share_needed(base, method, np.array([0.9, 0.1]), 3.0) is None


def test_each_bin_keeps_its_own_figures() -> None:
    history = tuple(
        HistoryItem(id=h["id"], task="headline", input=h["input"], output=h["output"]) for h in HISTORY
    )
    queries = tuple(BenchQuery(id=q["id"], input=q["input"], reference=q["output"]) for q in QUERIES)
    users = [BenchUser(user_id="u1", history=history, queries=queries)]

    def records(n3: float, n4: float) -> list[dict]:
        return [
            {"user_id": "u1", "queries": [{"query_id": "n3", "rouge1": n3}, {"query_id": "n4", "rouge1": n4}]}
        ]

    entry = gain_by_sibling(
        users,
        {"global": records(0.2, 0.2), "card-auto": records(0.8, 0.1)},
        "global",
        history_limit=None,
        target=1.25,
        n_resamples=100,
        seed=0,
    )
    assert [b["queries"] for b in entry["bins"]] == [1, 0, 1]
    low, middle, top = entry["methods"]["card-auto"]["bins"]
    assert (low["rouge1"], low["baseline_rouge1"], low["ratio"]) == (0.1, 0.2, 0.5)
    assert middle == {"bin": "0.3-0.5", "n": 0}
    # a bin of one query has its mean but no interval (a zero-width one would look significant)
    assert top["ratio"] == pytest.approx(4.0) and top["rouge1"] - top["baseline_rouge1"] == pytest.approx(0.6)
    assert top["delta"] is None and low["delta"] is None
    # ((1 - s) 0.1 + s 0.8) / 0.2 = 1.25 at s = 0.15 / 0.7
    assert entry["methods"]["card-auto"]["top_share_for_target"] == pytest.approx(0.15 / 0.7, abs=1e-4)
    # with the history cut to its last item the formula's sibling is gone: both queries fall in the low bin
    cut = gain_by_sibling(
        users, {"global": records(0.2, 0.2)}, "global", history_limit=1, target=1.25, n_resamples=10, seed=0
    )
    assert [b["queries"] for b in cut["bins"]] == [2, 0, 0]
    assert sibling_summary(entry, "card-auto") == (
        "50.0% of the queries have a sibling >= 0.5; card-auto / global: 0.500x at < 0.3, 4.000x at >= 0.5"
    )
    assert sibling_summary(entry, "card") is None


def test_script_reads_a_run_folder(tmp_path: Path) -> None:
    data = tmp_path / "test.jsonl"
    data.write_text(json.dumps({"user_id": "u1", "history": HISTORY, "queries": QUERIES}) + "\n")
    run = tmp_path / "run"
    run.mkdir()
    scores = {"global": {"n3": 0.2, "n4": 0.2}, "card-auto": {"n3": 0.8, "n4": 0.1}}
    lines = [
        json.dumps({"user": "u1", "query_id": query, "method": method, "rouge1": value})
        for method, by_query in scores.items()
        for query, value in by_query.items()
    ]
    (run / "outputs.jsonl").write_text("\n".join(lines) + "\n")
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(data), "--run", str(run)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert (
        "< 0.3: 1 queries (1 author); 0.3-0.5: 0 queries (0 authors); >= 0.5: 1 queries (1 author)"
        in result.stdout
    )
    assert "| card-auto | >= 0.5 | 1 | 0.2000 | 0.8000 | 4.000 |" in result.stdout
    assert "`card-auto` 21.4% (this run: 50.0%)" in result.stdout
    alone = subprocess.run(
        [sys.executable, str(SCRIPT), str(data)], capture_output=True, text=True, check=True
    )
    assert alone.stdout.startswith("2 queries by their sibling score:")


def test_script_bins_only_the_queries_the_run_scored(tmp_path: Path) -> None:
    """A run made with --max-queries scored fewer queries than the file yields; the script binned them all, so the
    counts and "this run: 50.0%" described n3, a query the run never scored (audit89 M4)."""
    data = tmp_path / "test.jsonl"
    data.write_text(json.dumps({"user_id": "u1", "history": HISTORY, "queries": QUERIES}) + "\n")
    run = tmp_path / "run"
    run.mkdir()
    lines = [
        json.dumps({"user": "u1", "query_id": "n4", "method": method, "rouge1": value})
        for method, value in (("global", 0.2), ("card-auto", 0.3))
    ]
    (run / "outputs.jsonl").write_text("\n".join(lines) + "\n")
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(data), "--run", str(run)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert (
        "< 0.3: 1 queries (1 author); 0.3-0.5: 0 queries (0 authors); >= 0.5: 0 queries (0 authors)"
        in result.stdout
    )
    assert "this run: 50.0%" not in result.stdout
    assert f"note: {run} scored 1 of the file's 2 queries with global: the bins count those" in result.stderr
