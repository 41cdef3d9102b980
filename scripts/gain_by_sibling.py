"""Where a bench run's gain comes from, for runs made before `localpers bench` reported it (RESULTS 0zm).

Queries are binned by their sibling score (`localpers.bench.siblings`: the best ROUGE-1 of an earlier
headline of the author against the author's real headline, a property of the data that no method sees).
Without `--run` it prints how many queries and authors each bin holds (e.g. on the train authors' dev split);
with `--run DIR` (a `localpers bench` output folder over the same file) it prints the table report.md now
carries: each method's mean ROUGE-1 per bin against the baseline, and the share of the top bin at which it
would reach the target ratio, over the queries the run's baseline scored (a run made with --max-queries or
--max-users scored fewer than the file yields; give --dev-split and --history-limit as the run had them). It decodes nothing and needs no bundle.

    python scripts/gain_by_sibling.py ../shared/data/news-headlines/test.jsonl --run ../bench-runs/test46c
    python scripts/gain_by_sibling.py ../shared/data/news-headlines/train.jsonl --dev-split
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from localpers.bench.data import load_bench_users
from localpers.bench.registry import BASELINE
from localpers.bench.report import sibling_lines
from localpers.bench.siblings import bin_names, gain_by_sibling, query_bins
from localpers.bench.targets import ROUGE_RATIO


def run_records(run: Path) -> dict[str, list[dict[str, Any]]]:
    """{method: [{"user_id", "queries": [{"query_id", "rouge1"}]}]} from a run's outputs.jsonl."""
    by_method: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    with (run / "outputs.jsonl").open(encoding="utf-8") as reader:
        for line in reader:
            if line.strip():
                record = json.loads(line)
                entry = {"query_id": record["query_id"], "rouge1": float(record["rouge1"])}
                by_method[record["method"]][record["user"]].append(entry)
    return {
        method: [{"user_id": user, "queries": queries} for user, queries in users.items()]
        for method, users in by_method.items()
    }


def _note_unscored(run: Path, baseline: list[dict[str, Any]], in_file: int) -> None:
    """Say when the run scored fewer queries than the file yields: the bins count only the scored ones."""
    scored = sum(len(record["queries"]) for record in baseline)
    if scored < in_file:
        print(
            f"note: {run} scored {scored} of the file's {in_file} queries with {BASELINE}: the bins count those",
            file=sys.stderr,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="bench file in the shared data's format")
    parser.add_argument(
        "--dev-split", action="store_true", help="train authors: their most recent 30%% as queries"
    )
    parser.add_argument("--run", type=Path, help="a `localpers bench` output folder over the same file")
    parser.add_argument("--history-limit", type=int, help="the run's --history-limit, if it had one")
    parser.add_argument("--methods", nargs="*", default=[], help="methods of the run to show (default: all)")
    args = parser.parse_args()

    users = load_bench_users(args.data, dev_split=args.dev_split)
    if args.run is None:
        bins = query_bins(users, args.history_limit)
        counts = np.bincount(list(bins.values()), minlength=len(bin_names()))
        print(f"{len(bins)} queries by their sibling score:")
        for index, name in enumerate(bin_names()):
            authors = sorted({user for (user, _), b in bins.items() if b == index})
            listed = ", ".join(authors[:8]) + (" ..." if len(authors) > 8 else "")
            print(
                f"  {name:>8}: {counts[index]:4d} ({counts[index] / len(bins):.1%}), {len(authors)} authors {listed}"
            )
        return

    records = run_records(args.run)
    if BASELINE not in records:
        raise SystemExit(f"{args.run}/outputs.jsonl has no {BASELINE!r} method to compare with")
    missing = [method for method in args.methods if method not in records]
    if missing:
        raise SystemExit(f"{args.run}/outputs.jsonl has no method {missing[0]!r}")
    if args.methods:
        records = {name: rows for name, rows in records.items() if name in (BASELINE, *args.methods)}
    _note_unscored(args.run, records[BASELINE], sum(len(user.queries) for user in users))
    entry = gain_by_sibling(
        users,
        records,
        BASELINE,
        history_limit=args.history_limit,
        target=ROUGE_RATIO,
        n_resamples=10_000,
        seed=0,
    )
    print("\n".join(sibling_lines({"by_sibling": entry})))


if __name__ == "__main__":
    main()
