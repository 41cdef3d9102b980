"""Fit benchmark: fresh CARD fits (y- generation, pair features, per-user choice) of several authors' items.

Each author of --data (shared-data format, the first --authors lines) becomes a fresh user in a temporary
home holding their --items most recent history items, and is fitted once per repeat with nothing cached (no
y-, no pair features): the cost of `localpers fit` on a new user, without the model load. Prints each fit's
seconds and stages, and the median. To compare two versions of the code, run it under each in turn
(`PYTHONPATH=<other checkout> python scripts/bench_fit.py ...`), alternating, on a quiet machine.

Usage: python scripts/bench_fit.py --data ../shared/data/news-headlines/test.jsonl [--authors 3] [--items 20]
       [--repeats 1] [--bundle DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from localpers.methods.card.personalizer import Personalizer
from localpers.users.history import HistoryItem
from localpers.users.store import UserStore


def author_histories(data: Path, authors: int, items: int) -> list[list[HistoryItem]]:
    histories = []
    for line in data.read_text(encoding="utf-8").splitlines()[:authors]:
        user = json.loads(line)
        history = [HistoryItem.create("headline", item["input"], item["output"]) for item in user["history"]]
        histories.append(history[-items:])
    return histories


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="shared-data JSONL (one author per line)")
    parser.add_argument("--authors", type=int, default=3)
    parser.add_argument("--items", type=int, default=20, help="most recent history items per author")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--bundle", default=None, help="bundle directory (default: pulled, else demo bundle)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    histories = author_histories(args.data, args.authors, args.items)
    fits = []
    with tempfile.TemporaryDirectory() as home:
        store = UserStore(Path(home))
        for repeat in range(args.repeats):
            # a fresh engine per repeat: no pair features or prompt state carried over from the last one
            personalizer = Personalizer.open(bundle=args.bundle)
            for author, history in enumerate(histories):
                user = store.create(f"a{author}r{repeat}")
                user.save_history(history)
                started = time.perf_counter()
                report = personalizer.fit_user(user)
                seconds = time.perf_counter() - started
                choice = json.loads((user.dir / "state.json").read_text()).get("choice") or {}
                fits.append(
                    {
                        "author": author,
                        "items": len(history),
                        "seconds": round(seconds, 3),
                        "stages": report.seconds,
                        "choice": choice.get("label"),
                    }
                )
            personalizer.close()
    result = {"median_seconds": round(statistics.median(f["seconds"] for f in fits), 3), "fits": fits}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for fit in fits:
            print(f"author {fit['author']}: {fit['seconds']:.2f} s  {fit['stages']}  choice {fit['choice']}")
        print(f"median {result['median_seconds']:.2f} s over {len(fits)} fits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
