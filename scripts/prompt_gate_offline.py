"""Offline: could a device tell, before decoding, which texts the history prompt helps?

For a bench run that decoded `global` (plain prompt) and `global-history` (the device's history prompt) on the
same queries, each query's gain (history R-1 minus plain R-1) is grouped by fifths of a signal the device has
before it decodes: the BM25 score of the user's closest earlier item (`closest`), that score over the mean score
of the user's items (`relative`), and the number of history items (`history`). A signal whose low or high fifths
lose reliably, across adapters, would let the device fall back to the plain prompt for those texts.

Then one signal known only after the history prompt's output is decoded: its resemblance to the examples the
prompt showed (the highest ROUGE-1 between the output and any of them; the device's 4 most recent + 1 closest),
by fifths, and what a fallback to the plain prompt's output below a resemblance threshold would change (the
device would then decode the plain prompt as well, for those texts). Decodes nothing; reads the run's cache (as
`scripts/compare_runs.py` does) and the data file it was run on.

Usage: python scripts/prompt_gate_offline.py ../bench-runs/RUN [RUN ...] --data ../shared/data/news-headlines/train.jsonl
       [--dev-split] [--max-queries 10]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from compare_runs import load

from localpers.bench.data import load_bench_users
from localpers.bench.metrics import rouge
from localpers.tasks import get_task
from localpers.users.history_prompt import (
    CLOSEST_PER_TEXT,
    PromptFormat,
    history_document,
    select_examples,
)
from localpers.users.retrieval import Bm25Index

SIGNALS = ("closest", "relative", "history")
# The device's prompt with the demo bundle's format: all but CLOSEST_PER_TEXT of the examples are the most recent.
SHOWN = PromptFormat().examples
RECENT = SHOWN - CLOSEST_PER_TEXT
THRESHOLDS = (0.1, 0.15, 0.2, 0.25, 0.3)


Key = tuple[str, str]  # (user, query id)


def query_signals(
    data: Path, dev_split: bool, max_queries: int | None
) -> tuple[dict[Key, dict[str, float]], dict[Key, list[str]]]:
    """Each query's signals, computed from the history the bench gave that user, and the examples shown."""
    task = get_task("headline")
    signals: dict[Key, dict[str, float]] = {}
    shown: dict[Key, list[str]] = {}
    for user in load_bench_users(data, dev_split=dev_split, max_queries=max_queries):
        pool = [(item.input, item.output) for item in user.history if item.task == task.name]
        if not pool:
            continue
        index = Bm25Index([history_document(task, text, output) for text, output in pool])
        for query in user.queries:
            scores = index.scores(task.content(query.input))
            closest = float(scores.max())
            signals[(user.user_id, query.id)] = {
                "closest": closest,
                "relative": closest / (float(scores.mean()) + 1e-9),
                "history": float(len(pool)),
            }
            shown[(user.user_id, query.id)] = select_examples(
                task, query.input, pool, SHOWN, index, recent=RECENT
            )
    return signals, shown


def paired_outputs(run: Path) -> dict[Key, tuple[dict, dict]]:
    """(user, query id) -> the global and global-history output rows, for the queries both methods decoded."""
    plain, history = load(f"{run}:global"), load(f"{run}:global-history")
    return {
        (user, query): (row, history[user][query])
        for user, rows in plain.items()
        for query, row in rows.items()
        if query in history.get(user, {})
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
    signals, shown = query_signals(args.data, args.dev_split, args.max_queries)
    for run in args.runs:
        pairs = paired_outputs(run)
        keys = [key for key in pairs if key in signals]
        plain = np.array([float(pairs[key][0]["rouge1"]) for key in keys])
        history = np.array([float(pairs[key][1]["rouge1"]) for key in keys])
        deltas = history - plain
        oracle = float(np.maximum(deltas, 0.0).mean())
        print(
            f"{run}: {len(keys)} queries, history - plain R-1 {deltas.mean():+.4f} (per-query oracle {oracle:+.4f})"
        )
        for name in SIGNALS:
            values = np.array([signals[key][name] for key in keys])
            fifths = ", ".join(f"{delta:+.4f}" for delta in by_fifths(values, deltas))
            print(f"  {name:>8} by fifths (low to high): {fifths}")
        resemblance = np.array(
            [
                max((rouge(pairs[key][1]["text"], example).rouge1 for example in shown[key]), default=0.0)
                for key in keys
            ]
        )
        fifths = ", ".join(f"{delta:+.4f}" for delta in by_fifths(resemblance, deltas))
        print(f"  after decoding, resemblance to the shown examples by fifths: {fifths}")
        for threshold in THRESHOLDS:
            fallback = resemblance < threshold
            change = float(np.where(fallback, plain, history).mean() - history.mean())
            print(
                f"    plain output below {threshold}: {change:+.4f} R-1, {fallback.mean():.0%} of texts decoded twice"
            )


if __name__ == "__main__":
    main()
