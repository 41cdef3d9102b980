"""Time CARD's pair pass one prompt at a time against batched groups (`engine.batch`), in one process, interleaved.

For each chosen dev-split author (train.jsonl, `--dev-split` protocol) it runs
`PairBuilder.negatives_and_differences` on the author's N most recent history items with empty caches, alternating
`engine.batch_sequences = 0` (one at a time) and the default, and prints wall and stage seconds, how many y- agree
and the largest gap in the first-token log-probabilities.

Usage: python scripts/bench_pairs.py [--users 0 1] [--items 20] [--repeats 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from localpers.bench.data import load_bench_users
from localpers.methods.card.personalizer import Personalizer
from localpers.users.store import UserStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data/news-headlines/train.jsonl")
    parser.add_argument("--users", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--items", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    users = load_bench_users(args.data, dev_split=True)
    personalizer = Personalizer.open(n_threads=args.threads)
    batched = personalizer.engine.batch_sequences
    for index in args.users:
        items = list(users[index].history[-args.items :])
        outputs = {}
        for mode in ("one at a time", "side by side") * args.repeats:
            user = UserStore(tempfile.mkdtemp()).create("timing")
            user.save_history(items)
            personalizer.pairs._pair_memo.clear()
            personalizer.engine.batch_sequences = 0 if mode == "one at a time" else batched
            started = time.perf_counter()
            negatives, _, first, seconds = personalizer.pairs.negatives_and_differences(user, items, 0, None)
            wall = time.perf_counter() - started
            outputs[mode] = (negatives, first)
            stages = ", ".join(f"{k} {v:.2f}" for k, v in seconds.items())
            print(f"user {index}: {mode:14s} {wall:6.2f} s ({stages})", flush=True)
        personalizer.engine.batch_sequences = batched
        (a, fa), (b, fb) = outputs["one at a time"], outputs["side by side"]
        gaps = [abs(x - y) for x, y in zip(fa, fb, strict=True) if x is not None and y is not None]
        print(
            f"user {index}: same y- {sum(x == y for x, y in zip(a, b, strict=True))}/{len(a)}, "
            f"largest first-token log-prob gap {max(gaps, default=0.0):.3f}"
        )


if __name__ == "__main__":
    main()
