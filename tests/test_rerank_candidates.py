"""`scripts/rerank_candidates.py evaluate` on hand-made candidates: greedy, consensus and oracle choices."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "rerank_candidates.py"
# The greedy candidate half matches the reference, three others agree with each other and not with it.
CANDIDATES = [
    "storm hits coast today",
    "city council votes budget",
    "city council passes budget",
    "city council votes",
]
REFERENCE = "storm hits coast"


def write_inputs(folder: Path, users: int) -> tuple[Path, Path]:
    bench, candidates = folder / "bench.jsonl", folder / "cands.jsonl"
    with bench.open("w") as b, candidates.open("w") as c:
        for u in range(users):
            history = [
                {
                    "id": f"h{u}{i}",
                    "input": f"Generate a headline for the following article: item {i}",
                    "output": f"Old News {i}",
                }
                for i in range(3)
            ]
            query = {
                "id": f"q{u}",
                "input": "Generate a headline for the following article: a storm",
                "output": REFERENCE,
            }
            b.write(json.dumps({"user_id": f"u{u}", "history": history, "queries": [query]}) + "\n")
            row = {"user": f"u{u}", "query_id": f"q{u}", "reference": REFERENCE, "chosen": CANDIDATES[1]}
            c.write(json.dumps({**row, "candidates": CANDIDATES}) + "\n")
    return bench, candidates


def test_rules_score_the_candidate_they_choose(tmp_path: Path) -> None:
    bench, candidates = write_inputs(tmp_path, users=5)
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "evaluate", str(candidates), "--data", str(bench)],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = dict(
        line.split(None, 1)
        for line in result.stdout.splitlines()
        if line.split()[0] in {"greedy", "consensus", "oracle"} and len(line.split()) == 2
    )
    # greedy: 3 of 4 words match the 3-word reference -> F1 6/7; consensus picks "city council votes budget"
    # (most agreement) -> 0; the oracle takes the greedy one.
    assert float(lines["greedy"]) == round(6 / 7, 4)
    assert float(lines["consensus"]) == 0.0
    assert float(lines["oracle"]) == round(6 / 7, 4)
    assert "cross-validated by author" in result.stdout
