"""`scripts/consensus_of_runs.py` on hand-made runs: the consensus output's recorded ROUGE-1 is the one scored."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "consensus_of_runs.py"


def _run(directory: Path, rows: list[tuple[str, str, str, float]]) -> Path:
    """A bench run's cache (`cache/<method>/<user>.json`, as `localpers bench` writes it) for user u1."""
    by_method: dict[str, list[dict]] = {}
    for query, method, text, rouge1 in rows:
        by_method.setdefault(method, []).append({"query_id": query, "text": text, "rouge1": rouge1})
    for method, queries in by_method.items():
        (directory / "cache" / method).mkdir(parents=True)
        (directory / "cache" / method / "u1.json").write_text(json.dumps({"user": "u1", "queries": queries}))
    return directory


def test_the_output_the_others_agree_with_is_scored(tmp_path: Path) -> None:
    # q1: the second and third runs agree ("storm hits coast"), so the second run's 0.6 is chosen, not the 0.0.
    # q2: every run wrote the same; the first is kept. q3 is missing from one run and is left out.
    first = _run(
        tmp_path / "a",
        [("q1", "m", "markets slide today", 0.0), ("q2", "m", "same words", 0.2), ("q3", "m", "x", 1.0)],
    )
    second = _run(tmp_path / "b", [("q1", "m", "storm hits coast", 0.6), ("q2", "m", "same words", 0.2)])
    third = _run(
        tmp_path / "c",
        [("q1", "m", "storm hits the coast", 0.5), ("q2", "m", "same words", 0.2), ("q2", "other", "y", 0.9)],
    )
    result = subprocess.run(
        [sys.executable, str(SCRIPT), f"{first}:m", f"{second}:m", f"{third}:m"],
        capture_output=True,
        text=True,
        check=True,
    )
    summary = result.stdout.strip().splitlines()[-1]
    assert summary.startswith("2 queries: consensus R-1 0.4000, mean member 0.2833, oracle 0.4000")
    assert "consensus - first member +0.3000" in summary


def test_fewer_than_three_runs_are_refused(tmp_path: Path) -> None:
    run = _run(tmp_path / "a", [("q1", "m", "a b", 0.1)])
    result = subprocess.run(
        [sys.executable, str(SCRIPT), f"{run}:m", f"{run}:m"], capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "at least three" in result.stderr
