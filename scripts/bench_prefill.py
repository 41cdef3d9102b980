"""Benchmark: prefill ms/token of conditioned prompts, into the fit's batched sequences and into sequence 0.

The fit's y- pass (`localpers.engine.batch`) prefills one conditioned prompt per history item into a batched
sequence; a rewrite prefills into sequence 0 (`Engine.prefill`). This times both over the same prompts (the
first user of `--data`, each item's prompt showing the items just before it, the default bundle's first
cluster adapter), alternating, to tell whether the fit's prefill is slower than it has to be. It prints ms per prompt token.
Usage: python scripts/bench_prefill.py [--data ../shared/data/news-headlines/test.jsonl] [--prompts 10] \
    [--rounds 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from localpers.methods.card.personalizer import Personalizer
from localpers.tasks import get_task
from localpers.users.history_prompt import conditioned_prompt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/news-headlines/test.jsonl"))
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    personalizer = Personalizer.open(model=None, bundle=None, n_threads=args.threads)
    engine = personalizer.engine
    engine.set_adapter(personalizer.bundle.cluster_adapter_name(0))
    prompt_format = personalizer.prompt_format
    if prompt_format is None:
        raise SystemExit("the bundle has no history-conditioned prompt format")
    with args.data.open(encoding="utf-8") as handle:
        history = json.loads(handle.readline())["history"]
    pairs = [(row["input"], row["output"]) for row in history]
    task = get_task("headline")
    # as the fit built them until the fifteenth session: each item's examples are the items just before it (the fit
    # now shares one block per group of items, `localpers.methods.card.fit_prompts.FIT_BLOCK_GROUP`); the first
    # has none
    prompts = [
        engine.tokenize(conditioned_prompt(task, pairs[index][0], pairs[:index], prompt_format))
        for index in range(1, min(args.prompts, len(pairs) - 1) + 1)
    ]
    n_tokens = sum(len(tokens) for tokens in prompts)

    batched, single = [], []
    for _ in range(args.rounds):
        started = time.perf_counter()
        for i, tokens in enumerate(prompts):
            sequence = 1 + i % engine.batch_sequences
            engine.forget_sequence(sequence)
            engine.eval_sequences(tokens, range(len(tokens)), [sequence] * len(tokens), all_outputs=False)
            engine.forget_sequence(sequence)
        batched.append(1000 * (time.perf_counter() - started) / n_tokens)
        started = time.perf_counter()
        for tokens in prompts:
            engine.reset()
            engine.prefill(tokens)
        single.append(1000 * (time.perf_counter() - started) / n_tokens)
    result = {
        "prompts": len(prompts),
        "prompt_tokens": [len(tokens) for tokens in prompts],
        "threads": engine.n_threads,
        "batched_sequence_ms_per_token": [round(v, 2) for v in batched],
        "sequence_0_ms_per_token": [round(v, 2) for v in single],
        "median_ratio": round(statistics.median(batched) / statistics.median(single), 3),
    }
    print(json.dumps(result, indent=2) if args.json else result)


if __name__ == "__main__":
    main()
