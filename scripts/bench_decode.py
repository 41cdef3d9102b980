"""Benchmark: ms/token of plain greedy decoding vs decoding with the 4 layer taps and a no-op method sampler.

The no-op sampler is one custom llama.cpp sampler whose callbacks run in Python (as CARD's and CoPe's do)
and that sees the whole vocabulary, so this measures the taps plus the cost of crossing into Python per step.

Both variants run interleaved in one process (plain, tapped, plain, tapped, ...) over the same prompt
and token count, so machine noise hits both alike; the medians and their ratio are reported.
Usage: python scripts/bench_decode.py [--tokens 64] [--repeats 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np

from localpers.engine import Engine
from localpers.engine.backbone import resolve_backbone
from localpers.engine.decoding import Candidates
from localpers.engine.generation import generate

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle. Once upon a time,"


class NoopSampler:
    """A method sampler that changes nothing."""

    name = "noop"
    candidate_limit = None

    def apply(self, candidates: Candidates, features: np.ndarray | None) -> None:
        return None

    def accept(self, token: int) -> None:
        return None


def run(tokens: int, repeats: int, model: str | None) -> dict[str, object]:
    backbone = resolve_backbone(model)
    plain = Engine(backbone.path, tap_layers=None)
    tapped = Engine(backbone.path)
    prompt_tokens = plain.tokenize(PROMPT)
    # Never stop early: compare the same number of decode steps.
    generate(plain, prompt_tokens, max_tokens=8)
    generate(tapped, prompt_tokens, max_tokens=8, method=NoopSampler())
    plain_ms: list[float] = []
    tapped_ms: list[float] = []
    for _ in range(repeats):
        a = generate(plain, prompt_tokens, max_tokens=tokens)
        b = generate(tapped, prompt_tokens, max_tokens=tokens, method=NoopSampler())
        if a.tokens != b.tokens:
            raise SystemExit("taps changed the greedy output: the benchmark would compare different work")
        plain_ms.append(a.ms_per_token)
        tapped_ms.append(b.ms_per_token)
    plain_median = statistics.median(plain_ms)
    tapped_median = statistics.median(tapped_ms)
    return {
        "backbone": backbone.path.name,
        "tokens_per_run": len(a.tokens),
        "repeats": repeats,
        "threads": plain.n_threads,
        "plain_ms_per_token": plain_ms,
        "taps_hook_ms_per_token": tapped_ms,
        "plain_median_ms": round(plain_median, 3),
        "taps_hook_median_ms": round(tapped_median, 3),
        "ratio": round(tapped_median / plain_median, 4),
        "target_ratio": 1.06,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per run")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved runs per variant")
    parser.add_argument("--model", default=None, help="backbone GGUF (default: embedded Gemma 3 270M)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    result = run(args.tokens, args.repeats, args.model)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"plain greedy       {result['plain_median_ms']:.2f} ms/token (median of {args.repeats})")
        print(f"4 taps + no-op hook {result['taps_hook_median_ms']:.2f} ms/token")
        print(f"ratio              {result['ratio']:.3f}x (target <= {result['target_ratio']}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
