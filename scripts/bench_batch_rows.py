"""What one batched llama_decode step costs by its number of rows: one token of each of N sequences.

Each of the engine's batched sequences first holds the same --prompt-tokens tokens; then, for every N of --rows,
one step evaluates one more token in each of N sequences (all rows' logits, as the fit's greedy steps do), and
the median of --repeats steps is printed with its cost per row. This is what decides how many prompts the fit
evaluates side by side (`localpers.engine.batch.GROUP_SIZE`; docs/PERFORMANCE.md, thirty-sixth session). Run it on
a quiet machine: another job on the same cores makes llama.cpp's threads wait on each other.

Usage: python scripts/bench_batch_rows.py [--model GGUF] [--rows 1 4 8 16] [--prompt-tokens 100] [--repeats 8]
       [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from localpers.engine import Engine
from localpers.engine.backbone import resolve_backbone


def step_costs(engine: Engine, rows: list[int], prompt_tokens: int, repeats: int) -> dict[int, float]:
    """Median seconds of one step of N rows, for each N of `rows` (N <= the engine's batched sequences)."""
    tokens = [int(t) for t in np.random.default_rng(0).integers(1000, 20000, size=prompt_tokens + repeats)]
    sequences = range(1, engine.batch_sequences + 1)
    for sequence in sequences:
        engine.forget_sequence(sequence)
        engine.eval_sequences(
            tokens[:prompt_tokens], range(prompt_tokens), [sequence] * prompt_tokens, all_outputs=False
        )
    costs: dict[int, float] = {}
    for count in rows:
        seconds = []
        for repeat in range(repeats):
            position = prompt_tokens + repeat
            started = time.perf_counter()
            engine.eval_sequences(
                [tokens[position]] * count, [position] * count, list(sequences)[:count], all_outputs=True
            )
            seconds.append(time.perf_counter() - started)
        for sequence in sequences:
            engine.forget_sequence(sequence, prompt_tokens)
        costs[count] = statistics.median(seconds)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="backbone GGUF (default: the one localpers resolves)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 6, 8, 12, 16, 20])
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    model = args.model or resolve_backbone().path
    engine = Engine(model, n_threads=args.threads, batch_sequences=max(args.rows))
    try:
        costs = step_costs(engine, sorted(set(args.rows)), args.prompt_tokens, args.repeats)
    finally:
        engine.close()
    if args.json:
        print(
            json.dumps(
                {str(n): {"ms_per_step": 1000 * s, "ms_per_row": 1000 * s / n} for n, s in costs.items()}
            )
        )
        return
    for count, seconds in costs.items():
        print(f"{count:3d} rows: {1000 * seconds:7.1f} ms per step, {1000 * seconds / count:5.1f} ms per row")


if __name__ == "__main__":
    main()
