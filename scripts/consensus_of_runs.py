"""Offline: the consensus among several bench runs' outputs for the same queries (RESULTS 0zi).

Each `RUN:METHOD` names one output per query (a `localpers bench` run directory and a method in its cache, read
as `scripts/compare_runs.py` reads them). Per query the candidates are those outputs in the order given; the device's consensus rule
(`localpers.methods.consensus.choose_consensus`: highest mean ROUGE-1 against the others, the first on ties)
picks one, and its ROUGE-1 against the author's headline is the one the bench already recorded for that row. It
prints the consensus's R-1, each member's, the mean member's and the per-query oracle's, and the consensus's
paired difference from the first member with its bootstrap interval. Only queries every run answered count.

    python scripts/consensus_of_runs.py ../bench-runs/dev37-a-q10:global-history \
        ../bench-runs/dev37-a-s1-q10:global-history ../bench-runs/dev37-lr1e3-q10:global-history \
        ../bench-runs/dev38-rec4-q10:global-history

This says what decoding with several adapters and keeping their consensus would give; the device cannot do it
in one batch (llama.cpp applies a LoRA adapter to a whole context, not to one sequence of a batch).
"""

from __future__ import annotations

import argparse

from compare_runs import load

from localpers.bench.metrics import paired_bootstrap
from localpers.methods.consensus import choose_consensus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="RUN_DIRECTORY:METHOD, at least three")
    args = parser.parse_args()
    if len(args.runs) < 3:
        raise SystemExit("the consensus needs at least three candidates per query; name three or more runs")
    members = [
        {
            (user, query_id): (row["text"], float(row["rouge1"]))
            for user, rows in load(spec).items()
            for query_id, row in rows.items()
        }
        for spec in args.runs
    ]
    keys = sorted(set.intersection(*(set(member) for member in members)))
    if not keys:
        raise SystemExit("the runs share no query")
    chosen, oracle, mean_member = [], [], []
    for key in keys:
        candidates = [member[key] for member in members]
        pick = choose_consensus([text for text, _ in candidates]).index
        scores = [score for _, score in candidates]
        chosen.append(scores[pick])
        oracle.append(max(scores))
        mean_member.append(sum(scores) / len(scores))
    n = len(keys)
    for spec, member in zip(args.runs, members, strict=True):
        print(f"member {spec}: R-1 {sum(member[key][1] for key in keys) / n:.4f}")
    first = [members[0][key][1] for key in keys]
    gain = paired_bootstrap(chosen, first)
    print(
        f"{n} queries: consensus R-1 {sum(chosen) / n:.4f}, mean member {sum(mean_member) / n:.4f}, "
        f"oracle {sum(oracle) / n:.4f}; consensus - first member {gain.mean:+.4f} [{gain.low:+.4f}, {gain.high:+.4f}]"
    )


if __name__ == "__main__":
    main()
