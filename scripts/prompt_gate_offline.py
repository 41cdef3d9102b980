"""Offline: could a device tell, before decoding, which texts the history prompt helps?

For a bench run that decoded `global` (plain prompt) and `global-history` (the device's history prompt) on the
same queries, each query's gain (history R-1 minus plain R-1) is grouped by fifths of a signal the device has
before it decodes: the BM25 score of the user's closest earlier item (`closest`), that score over the mean score
of the user's items (`relative`), and the number of history items (`history`). A signal whose low or high fifths
lose reliably, across adapters, would let the device fall back to the plain prompt for those texts. Decodes
nothing; reads the run's outputs and the data file it was run on.

Usage: python scripts/prompt_gate_offline.py ../bench-runs/RUN [RUN ...] --data ../shared/data/news-headlines/train.jsonl
       [--dev-split] [--max-queries 10]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from localpers.bench.data import load_bench_users
from localpers.tasks import get_task
from localpers.users.history_prompt import content_of, history_document
from localpers.users.retrieval import Bm25Index

SIGNALS = ("closest", "relative", "history")


def query_signals(
    data: Path, dev_split: bool, max_queries: int | None
) -> dict[tuple[str, str], dict[str, float]]:
    """(user, query id) -> each signal's value, computed from the history the bench gave that user."""
    task = get_task("headline")
    signals: dict[tuple[str, str], dict[str, float]] = {}
    for user in load_bench_users(data, dev_split=dev_split, max_queries=max_queries):
        pool = [(item.input, item.output) for item in user.history if item.task == task.name]
        if not pool:
            continue
        index = Bm25Index([history_document(task, text, output) for text, output in pool])
        for query in user.queries:
            scores = index.scores(content_of(task, query.input))
            closest = float(scores.max())
            signals[(user.user_id, query.id)] = {
                "closest": closest,
                "relative": closest / (float(scores.mean()) + 1e-9),
                "history": float(len(pool)),
            }
    return signals


def gains(run: Path) -> dict[tuple[str, str], float]:
    """(user, query id) -> global-history's R-1 minus global's, for the queries both methods decoded."""
    rouge: dict[tuple[str, str, str], float] = {}
    with (run / "outputs.jsonl").open(encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            rouge[(row["user"], row["query_id"], row["method"])] = float(row["rouge1"])
    return {
        (user, query): rouge[(user, query, "global-history")] - value
        for (user, query, method), value in rouge.items()
        if method == "global" and (user, query, "global-history") in rouge
    }


def by_fifths(values: np.ndarray, deltas: np.ndarray) -> list[float]:
    """Mean delta in each fifth of the queries ordered by `values`, lowest first (ties in query order)."""
    order = np.argsort(values, kind="stable")
    return [float(deltas[part].mean()) for part in np.array_split(order, 5)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--dev-split", action="store_true")
    parser.add_argument("--max-queries", type=int, default=None)
    args = parser.parse_args()
    signals = query_signals(args.data, args.dev_split, args.max_queries)
    for run in args.runs:
        per_query = gains(run)
        keys = [key for key in per_query if key in signals]
        deltas = np.array([per_query[key] for key in keys])
        oracle = float(np.maximum(deltas, 0.0).mean())
        print(
            f"{run}: {len(keys)} queries, history - plain R-1 {deltas.mean():+.4f} (per-query oracle {oracle:+.4f})"
        )
        for name in SIGNALS:
            values = np.array([signals[key][name] for key in keys])
            fifths = ", ".join(f"{delta:+.4f}" for delta in by_fifths(values, deltas))
            print(f"  {name:>8} by fifths (low to high): {fifths}")


if __name__ == "__main__":
    main()
