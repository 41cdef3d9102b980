"""Which queries of an author file the device's prompt shows a series for, and what two runs wrote there (RESULTS 0zn).

For every query it builds the device's examples twice, with the series rule (`localpers.users.series`) and
without, from the author's history as `localpers bench` gives it, and counts the queries (and authors) where
they differ: the only queries on which the rule can change an output. With `--runs A:METHOD B:METHOD` (two
bench runs over the same file) it prints both runs' mean ROUGE-1 on those queries and on the others, and how
many outputs differ in each group. It decodes nothing and needs no bundle.

    python scripts/series_queries.py ../shared/data/news-headlines/train.jsonl --dev-split \
        --runs ../bench-runs/dev47-a:global-history ../bench-runs/dev48-series:global-history
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from localpers.bench.data import BenchQuery, BenchUser, load_bench_users
from localpers.tasks import get_task
from localpers.users.history_index import HistoryIndex
from localpers.users.history_prompt import PromptFormat
from localpers.users.series import MIN_SIZE

DEVICE = PromptFormat(examples=5, recent=4, series=MIN_SIZE)
WITHOUT = PromptFormat(examples=5, recent=4)


def headline_index(user: BenchUser) -> HistoryIndex:
    """The user's headline history as the device indexes it."""
    task = get_task("headline")
    return HistoryIndex(task, [(i.input, i.output) for i in user.history if i.task == task.name])


def output_key(user: BenchUser, query: BenchQuery) -> tuple[str, str]:
    """A query's key in a run's outputs.jsonl: the bench names users there by user_id, not by store name."""
    return user.user_id, query.id


def series_queries(path: Path, dev_split: bool) -> tuple[set[tuple[str, str]], int]:
    """{(user id, query id)} where the rule changes the device's prompt, and the number of queries."""
    changed: set[tuple[str, str]] = set()
    total = 0
    for user in load_bench_users(path, dev_split=dev_split):
        index = headline_index(user)
        for query in user.queries:
            total += 1
            if index.pool and index.prompt_for(query.input, DEVICE) != index.prompt_for(query.input, WITHOUT):
                changed.add(output_key(user, query))
    return changed, total


def outputs(run_method: str) -> dict[tuple[str, str], tuple[float, str]]:
    """{(user, query id): (ROUGE-1, text)} of one method in a run's outputs.jsonl ("DIR:METHOD")."""
    run, method = run_method.rsplit(":", 1)
    found = {}
    with (Path(run) / "outputs.jsonl").open(encoding="utf-8") as reader:
        for line in reader:
            record = json.loads(line) if line.strip() else None
            if record and record["method"] == method:
                found[(record["user"], record["query_id"])] = (float(record["rouge1"]), record["text"])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path)
    parser.add_argument("--dev-split", action="store_true")
    parser.add_argument("--runs", nargs=2, metavar="DIR:METHOD")
    args = parser.parse_args()
    changed, total = series_queries(args.data, args.dev_split)
    authors = sorted({user for user, _ in changed})
    print(f"{len(changed)} of {total} queries ({len(authors)} authors: {', '.join(authors)}) show a series")
    if not args.runs:
        return
    before, after = (outputs(spec) for spec in args.runs)
    for name, keys in (("series shown", changed), ("no series", set(before) - changed)):
        keys = sorted(keys & set(after))
        if not keys:
            continue
        a = np.array([before[k][0] for k in keys])
        b = np.array([after[k][0] for k in keys])
        differ = sum(before[k][1] != after[k][1] for k in keys)
        print(
            f"{name}: {len(keys)} queries, R-1 {a.mean():.4f} -> {b.mean():.4f} ({b.mean() - a.mean():+.4f}),"
            f" {differ} outputs differ"
        )


if __name__ == "__main__":
    main()
