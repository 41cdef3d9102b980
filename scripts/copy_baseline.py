"""What copying an earlier headline of the author would score: a retrieval-only baseline (RESULTS 0zg).

For every query of a bench file (the test file, or train authors with `--dev-split`), it scores against the
author's real headline, with ROUGE-1 F1 as the bench does: the author's earlier headline that BM25 finds closest
to the new article (the device's own retrieval, `localpers.users.history_prompt.select_examples`, over each
earlier item's article and headline), the
most recent earlier headline, and the best of the last 20 (an oracle: chosen with the answer). It also prints how
many closest headlines reach a given R-1 and the mean R-1 of the closest by fifths of BM25 score. It decodes
nothing and needs no bundle.

    python scripts/copy_baseline.py ../shared/data/news-headlines/train.jsonl --dev-split
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from localpers.bench.data import load_bench_users
from localpers.bench.metrics import rouge
from localpers.bench.siblings import sibling_score
from localpers.tasks import get_task
from localpers.users.history import DEFAULT_TASK
from localpers.users.history_prompt import history_document, select_examples
from localpers.users.retrieval import Bm25Index

ORACLE_WINDOW = 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="bench file in the shared data's format")
    parser.add_argument(
        "--dev-split", action="store_true", help="train authors: their most recent 30%% as queries"
    )
    args = parser.parse_args()

    task = get_task(DEFAULT_TASK)
    closest, recent, oracle, bm25 = [], [], [], []
    for user in load_bench_users(args.data, dev_split=args.dev_split):
        history = list(user.history)
        if not history:  # the bench scores such an author; a copy has nothing to copy
            raise SystemExit(
                f"{args.data} line {user.line}: user {user.user_id} has no history to copy a headline from: give a"
                " file whose authors all have history items"
            )
        pool = [(item.input, item.output) for item in history]
        index = Bm25Index([history_document(task, text, output) for text, output in pool])
        for query in user.queries:
            (copied,) = select_examples(task, query.input, pool, 1, index)
            closest.append(rouge(copied, query.reference).rouge1)
            recent.append(rouge(history[-1].output, query.reference).rouge1)
            oracle.append(sibling_score([item.output for item in history[-ORACLE_WINDOW:]], query.reference))
            bm25.append(float(index.scores(task.content(query.input)).max()))
    closest_r1 = np.asarray(closest)
    print(
        f"{len(closest)} queries: R-1 of the closest earlier headline {closest_r1.mean():.4f}, the most recent "
        f"{np.mean(recent):.4f}, the best of the last {ORACLE_WINDOW} (oracle) {np.mean(oracle):.4f}"
    )
    for threshold in (0.3, 0.5, 0.7):
        print(f"closest headline at R-1 >= {threshold}: {int((closest_r1 >= threshold).sum())} queries")
    order = np.argsort(bm25)
    for fifth, positions in enumerate(np.array_split(order, 5), start=1):
        if not len(positions):  # fewer than 5 queries
            continue
        low, high = bm25[positions[0]], bm25[positions[-1]]
        print(f"BM25 fifth {fifth} ({low:.2f}-{high:.2f}): closest R-1 {closest_r1[positions].mean():.4f}")


if __name__ == "__main__":
    main()
