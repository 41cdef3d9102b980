"""Benchmark: listing a history's series (`users.series.distinct_series`) against comparing every pair.

The TUI's profile lists a user's series after every accept, reject and import, in the interface's thread. This
times `distinct_series` and the pairwise search it replaced (`find_series` around each output, what it computed
until the seventy-fifth session) on real headlines (each author's earlier 70%, the dev split's histories): the
first N outputs of the corpus's authors together, and the most prolific author's outputs repeated to N. Checks
that both give the same series; prints medians in ms.

Usage: python scripts/bench_series.py --data ../shared/data/news-headlines/train.jsonl [--sizes 100 500 2000]
    [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

from localpers.bench.data import load_bench_users
from localpers.users.series import distinct_series, find_series, word_set


def pairwise_series(outputs: Sequence[str]) -> list[list[int]]:
    """The series as the comparison of every output with every other finds them."""
    sets = [word_set(output) for output in outputs]
    counted: set[int] = set()
    found: list[list[int]] = []
    for position in reversed(range(len(outputs))):
        if position in counted:
            continue
        members = find_series(outputs, [position], word_sets=sets)
        if members:
            found.append(members)
            counted.update(members)
    return found


def median_ms(
    function: Callable[[Sequence[str]], list[list[int]]], outputs: Sequence[str], repeats: int
) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function(outputs)
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 500, 2000])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    users = load_bench_users(args.data, dev_split=True)  # histories only: each author's earlier 70%
    everyone = [item.output for user in users for item in user.history]
    prolific = max(users, key=lambda user: len(user.history))
    own = [item.output for item in prolific.history]
    print(f"{'history':<36} {'series':>6} {'pairwise ms':>12} {'indexed ms':>11}")
    for size in args.sizes:
        for label, outputs in (
            (f"{size} outputs of all authors", everyone[:size]),
            (f"{size} of one author (repeated)", (own * (size // len(own) + 1))[:size]),
        ):
            found = distinct_series(outputs)
            assert found == pairwise_series(outputs), label
            pairwise = median_ms(pairwise_series, outputs, args.repeats)
            indexed = median_ms(distinct_series, outputs, args.repeats)
            print(f"{label:<36} {len(found):>6} {pairwise:>12.1f} {indexed:>11.1f}")


if __name__ == "__main__":
    main()
