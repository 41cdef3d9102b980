"""Experiment: `localpers publish` with answer-chosen examples in part of the training prompts (issue 20).

The history-conditioned adapter barely uses its prompt's closest example: shown the author's earlier headline
that is nearest the real one (chosen with the answer), it gains only +0.002 R-1 on the dev split (RESULTS 0v),
although that example alone scores 0.20. One explanation is training: the BM25-closest example the adapter
was trained with is rarely near the target (0.08 R-1), so copying from it never paid. Here a share
(`--share`) of the history-conditioned training items show, as their closest example (the last one, next to
the task), the author's earlier headline with the highest ROUGE-1 against the item's own headline; the other
examples stay BM25's. An adapter trained so may learn to copy when the closest example fits, and not
otherwise. Which items get it is fixed by a hash of (author, position), so a rerun trains the same.

This script patches the publisher's sft prompts for its own process only (pairs and features keep the
device's prompts); it does not change the product. Everything after `--` goes to `localpers publish`:

    python scripts/train_oracle_prompts.py --share 0.5 -- ../train-heldout.jsonl --out ../heldout-oracle50 \
        --k 1 --history-examples 5 --global-epochs 0.54 --cluster-epochs 0.01 ... --until export
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from typing import Any

from localpers.methods.consensus import unigram_f1, unigrams
from localpers.publish import prompts, sft
from localpers.tasks import get_task
from localpers.users.history_index import HistoryIndex
from localpers.users.history_prompt import PromptFormat, conditioned_prompt
from localpers.users.retrieval import Bm25Index


class FirstThenBm25:
    """A search whose best hit is a fixed item, then BM25's order over the same documents."""

    def __init__(self, bm25: Bm25Index, first: int) -> None:
        self.bm25, self.first = bm25, first

    def top(self, query: str, k: int) -> list[int]:
        rest = [i for i in self.bm25.top(query, k + 1) if i != self.first]
        return [self.first, *rest][:k]


def chosen(user_id: str, position: int, share: float) -> bool:
    digest = hashlib.sha256(f"{user_id}\t{position}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def oracle_prompts(context: Any, user: Any, share: float, stats: dict[str, int]) -> list[str]:
    """`prompts.user_prompts`, with the answer-nearest earlier headline as the closest example on a share."""
    task = get_task(context.options.task)
    prompt_format: PromptFormat | None = prompts.prompt_format(context)
    plain = prompts.user_prompts(context, user)
    if prompt_format is None:
        return plain
    result = []
    for position, item in enumerate(user.history):
        pool = prompts.earlier_items(user, position)
        if not pool or not chosen(user.user_id, position, share):
            result.append(plain[position])
            continue
        target = unigrams(item.output)
        best = max(range(len(pool)), key=lambda i: (unigram_f1(unigrams(pool[i][1]), target), -i))
        bm25 = HistoryIndex(task, pool)._index  # the device's BM25 documents, built the device's way
        index = FirstThenBm25(bm25, best)
        result.append(conditioned_prompt(task, item.input, pool, prompt_format, index))
        stats["changed"] += 1
        stats["same"] += bm25.top(task.content(item.input), 1) == [best]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--share", type=float, default=0.5, help="share of items shown the answer-chosen example"
    )
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    stats = {"changed": 0, "same": 0}
    sft.user_prompts = lambda context, user: oracle_prompts(context, user, args.share, stats)
    from localpers.cli import app

    try:
        app(["publish", *argv[split + 1 :]], standalone_mode=False)
    finally:
        print(
            f"answer-chosen closest example in {stats['changed']} training prompts"
            f" ({stats['same']} the same as BM25's)",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
