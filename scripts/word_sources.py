"""Where the words of the authors' real headlines come from, and which of them each method's outputs recall.

For every query of a bench run, the distinct words (tokenised and stemmed as rouge-score does) of the author's
headline are put in one of four groups: in the article and the author's history, in the article only, in the
history only, in neither. For each group it prints its share of the words and the fraction of them that each
method's output contains; also the R-1 of the best single earlier headline of the author (an oracle: chosen with
the answer). It reads the run's `outputs.jsonl` and the data file it was run on; it decodes nothing.

    python scripts/word_sources.py ../bench-runs/dev25-mix05-q10 global,global-history \
        ../shared/data/news-headlines/train.jsonl --dev-split
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from localpers.bench.data import load_bench_users
from localpers.bench.metrics import rouge
from localpers.methods.consensus import unigrams

GROUPS = {
    "article and history": (True, True),
    "article only": (True, False),
    "history only": (False, True),
    "neither": (False, False),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a `localpers bench` output directory")
    parser.add_argument("methods", help="comma-separated methods of that run")
    parser.add_argument("data", type=Path, help="the JSONL the run used")
    parser.add_argument("--dev-split", action="store_true", help="the run used --dev-split")
    args = parser.parse_args()
    methods = args.methods.split(",")
    users = {user.user_id: user for user in load_bench_users(args.data, dev_split=args.dev_split)}
    outputs: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)
    for line in (args.run / "outputs.jsonl").open():
        row = json.loads(line)
        outputs[(row["user"], row["query_id"])][row["method"]] = row["text"]

    shares: dict[str, int] = defaultdict(int)
    recalled: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    best_earlier = []
    for (user_id, query_id), texts in outputs.items():
        user = users[user_id]
        query = next(q for q in user.queries if q.id == query_id)
        article = set(unigrams(query.input))
        history = {word for item in user.history for word in unigrams(item.output)}
        method_words = {method: set(unigrams(texts.get(method, ""))) for method in methods}
        best_earlier.append(
            max((rouge(item.output, query.reference).rouge1 for item in user.history), default=0.0)
        )
        for word in unigrams(query.reference):
            group = next(name for name, key in GROUPS.items() if key == (word in article, word in history))
            shares[group] += 1
            for method in methods:
                recalled[method][group] += word in method_words[method]

    total = sum(shares.values())
    print(f"{len(outputs)} queries; best single earlier headline (oracle) R-1 {np.mean(best_earlier):.4f}")
    print(f"{'the word is in':22s} share  " + "  ".join(f"{m:>16s}" for m in methods))
    for group in GROUPS:
        cells = "  ".join(f"{recalled[m][group] / max(shares[group], 1):16.3f}" for m in methods)
        print(f"{group:22s} {shares[group] / total:.3f}  {cells}")


if __name__ == "__main__":
    main()
