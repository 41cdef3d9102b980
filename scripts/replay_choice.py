"""Replay the per-user choice with a candidate set of two runs together, without decoding anything.

A bench run stores, per user, the choice's likelihood of every candidate it offered and the outputs of the one it
chose. Given run A (one candidate set) and run B (another) of the same method on the same users, this script
says, for a rule over both sets, what each user would choose and scores it from whichever run decoded that choice.
The fit behind the choice is deterministic, so A's and B's shared candidates score the same (checked). A user whose
replayed choice neither run decoded is counted as unknown and left out of both means.

The rule replayed here is the device's (`localpers.methods.card.choice.candidates_for`): a user whose token bias
has an opening or closing habit (B's `habits` candidate scores differently from the adapter alone) is offered B's
habits candidates instead of A's x0.1 ones; any other user keeps A's set. The best candidate wins by any lead,
as the device chose until the fifty-ninth session (`choice.MIN_LEAD` since; RESULTS 0zr).
Usage: python scripts/replay_choice.py ../bench-runs/dev-a:card-auto ../bench-runs/dev-a-habits:card-auto
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from localpers.methods.card.choice import HABITS_CANDIDATES, LIGHT_BIAS_CANDIDATES

LIGHT = tuple(candidate.label for candidate in LIGHT_BIAS_CANDIDATES)
HABITS = tuple(candidate.label for candidate in HABITS_CANDIDATES)


def load(spec: str) -> dict[str, dict]:
    """{user: cached record} of one method in one run (RUN_DIR:METHOD)."""
    run, _, method = spec.rpartition(":")
    folder = Path(run) / "cache" / method
    if not folder.is_dir():
        raise SystemExit(f"{folder} does not exist: run the bench with -m {method} --out {run} first")
    return {
        record["user"]: record
        for record in map(json.loads, map(Path.read_text, sorted(folder.glob("*.json"))))
    }


def replay(a: dict[str, dict], b: dict[str, dict]) -> dict[str, object]:
    """Per-user replayed choice and the mean ROUGE-1 of the rule against A's own choices, on the known users."""
    rule: list[float] = []
    shipped: list[float] = []
    counts = {"users": len(a), "with_habits": 0, "changed": 0, "unknown": 0}
    for user, record in a.items():
        a_rouge = [q["rouge1"] for q in record["queries"]]
        a_choice = record.get("choice") or {}
        b_choice = (b.get(user) or {}).get("choice") or {}
        a_scores, b_scores = a_choice.get("scores"), b_choice.get("scores")
        if not a_scores or not b_scores:  # no choice made (too few items): both runs decode the same
            rule += a_rouge
            shipped += a_rouge
            continue
        if abs(a_scores["adapter"] - b_scores["adapter"]) > 1e-3:
            raise SystemExit(
                f"{user}: the two runs' fits differ (adapter scores {a_scores['adapter']}, "
                f"{b_scores['adapter']}); replay needs the same bundle and history"
            )
        scores = dict(a_scores)
        if abs(b_scores["habits"] - b_scores["adapter"]) > 1e-6:
            counts["with_habits"] += 1
            for label in LIGHT:
                scores.pop(label, None)
            scores.update({label: b_scores[label] for label in HABITS})
        best = max(scores, key=lambda label: scores[label])
        if best == a_choice["label"]:
            rule += a_rouge
        elif best == b_choice["label"]:
            rule += [q["rouge1"] for q in b[user]["queries"]]
            counts["changed"] += 1
        else:
            counts["unknown"] += 1
            continue
        shipped += a_rouge
    return {
        **counts,
        "rule_rouge1": round(float(np.mean(rule)), 4),
        "a_rouge1": round(float(np.mean(shipped)), 4),
        "queries": len(rule),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_a", help="RUN_DIR:METHOD decoded with the x0.1 candidates")
    parser.add_argument("run_b", help="RUN_DIR:METHOD decoded with the habits candidates instead")
    args = parser.parse_args()
    print(json.dumps(replay(load(args.run_a), load(args.run_b)), indent=1))


if __name__ == "__main__":
    main()
