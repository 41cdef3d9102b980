"""Experiment: `localpers publish` with the training loss weighted toward words the author's examples show.

A different training signal for the history-conditioned adapters (issue 20): in each history-conditioned
training item, the target tokens that occur in the prompt's example headlines but not in the article (and are
not among the corpus's most frequent target tokens) get weight `--weight` in the cross-entropy; every other
token keeps weight 1 (the loss is the weighted mean). The intent is an adapter that leans harder on the user's
own wording. Plain-prompt items are unchanged. `--only-items FILE` (lines: user id, tab, output) trains on
those items alone, as `scripts/self_targets.py corpus` lists them (the adapter trained on its own candidates).

This script patches the publisher's tokenisation and training pass for its own process only; it does not
change the product. Everything after `--` is passed to `localpers publish` as is, e.g.

    python scripts/train_weighted.py --weight 3 -- ../train-heldout.jsonl --out ../heldout-w3 --k 1 \
        --history-examples 5 --global-epochs 0.54 --cluster-epochs 0.01 ... --until export
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from localpers.engine import torch_model
from localpers.publish import sft, sft_stage

EXAMPLES_HEADER = "Headlines this author wrote before:"


def split_prompt(prompt_text: str) -> tuple[str, str]:
    """(examples block, the plain task prompt) of a training prompt; ("", prompt) when it shows no examples."""
    if not prompt_text.startswith(EXAMPLES_HEADER) or "\n\n" not in prompt_text:
        return "", prompt_text
    cut = prompt_text.rindex("\n\n")
    return prompt_text[:cut], prompt_text[cut:]


def install(weight: float, frequent: int, only: set[tuple[str, str]] | None) -> dict[str, Any]:
    """Patch the publisher for this process; returns counters the caller can print."""
    weights_of: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[float, ...]] = {}
    stats: dict[str, Any] = {"targets": 0, "weighted": 0}
    kept: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    user_ids: list[str] = []
    original_tokenise = torch_model.tokenise_examples
    original_make_batch = torch_model.make_batch
    original_split = sft_stage.split_examples

    def split_examples(context: Any) -> tuple[list[Any], list[Any], list[int]]:
        user_ids[:] = [user.user_id for user in context.corpus.users]
        train, val, clusters = original_split(context)
        if only is not None:
            train = [e for e in train if (e.prompt, e.target) in kept]
            print(f"training on the {len(train)} listed items only", file=sys.stderr)
        return train, val, clusters

    def tokenise_examples(backbone: Any, pairs: list[tuple[str, str, int]], max_len: int) -> list[Any]:
        examples = original_tokenise(backbone, pairs, max_len)
        if only is not None:
            for (_, output, user), example in zip(pairs, examples, strict=True):
                if user_ids and (user_ids[user], output.strip()) in only:
                    kept.add((example.prompt, example.target))
        if weight == 1.0:
            return examples
        engine = torch_model._tokeniser_engine(backbone)
        counts = Counter(token for example in examples for token in example.target)
        common = {token for token, _ in counts.most_common(frequent)}
        for (prompt_text, _, _), example in zip(pairs, examples, strict=True):
            block, plain = split_prompt(prompt_text)
            if not block:
                continue
            shown = set(engine.tokenize(block, add_bos=False))
            article = set(engine.tokenize(plain, add_bos=False))
            marks = tuple(
                weight if token in shown and token not in article and token not in common else 1.0
                for token in example.target
            )
            weights_of[(example.prompt, example.target)] = marks
            stats["targets"] += len(marks)
            stats["weighted"] += sum(1 for m in marks if m != 1.0)
        share = stats["weighted"] / max(1, stats["targets"])
        print(
            f"weighted so far: {stats['weighted']}/{stats['targets']} target tokens ({share:.1%})",
            file=sys.stderr,
        )
        return examples

    def make_batch(examples: Any, pad_id: int = 0) -> dict[str, Any]:
        import torch

        batch = original_make_batch(examples, pad_id)
        marks: list[float] = []
        for example in examples:
            marks.extend(weights_of.get((example.prompt, example.target), (1.0,) * len(example.target)))
        batch["weights"] = torch.tensor(marks, dtype=torch.float32)
        return batch

    def train_pass(model: Any, batch: dict[str, Any], precision: str) -> float:
        with sft.autocast(precision, torch_model.model_device(model).type):
            losses = torch_model.target_token_losses(model, batch)
            weights = batch["weights"].to(losses.device)
            loss = (losses * weights).sum() / weights.sum()
        loss.backward()
        return float(loss.detach())

    torch_model.tokenise_examples = tokenise_examples
    torch_model.make_batch = make_batch
    sft._train_pass = train_pass
    sft_stage.split_examples = split_examples
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weight", type=float, default=1.0, help="loss weight of the example-only tokens")
    parser.add_argument(
        "--only-items", type=Path, help="train only on these items (lines: user id, tab, output)"
    )
    parser.add_argument(
        "--frequent", type=int, default=50, help="most frequent target tokens left at weight 1"
    )
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    only = None
    if args.only_items:
        lines = args.only_items.read_text().splitlines()
        only = {tuple(line.split("\t", 1)) for line in lines if "\t" in line}
    stats = install(args.weight, args.frequent, only)
    from localpers.cli import app

    try:
        app(["publish", *argv[split + 1 :]], standalone_mode=False)
    finally:
        share = stats["weighted"] / max(1, stats["targets"])
        print(
            f"weighted target tokens: {stats['weighted']}/{stats['targets']} ({share:.1%})", file=sys.stderr
        )


if __name__ == "__main__":
    main()
