"""Benchmark: what CARD's correction costs per token inside llama.cpp's sampler chain, measured in one run.

Three chains decode the same prompts on the same tapped engine with the same cluster adapter, interleaved
(A, B, C, A, B, C, ...), each for exactly `--tokens` tokens (end-of-generation tokens are banned through a
logit bias in all three, so every run does the same number of steps):

    A  plain         greedy                             (what `--method cluster` decodes with)
    B  top-k         top_k(k) -> greedy                 (the CARD chain without the correction)
    C  card          top_k(k) -> CARD correction -> greedy
    D  card+bias     CARD correction with the user's token bias -> greedy   (only with --user, when the
                     user's fit stored a token bias: the correction then makes its own top-k cut and adds
                     the user's habitual tokens, as `localpers rewrite` decodes)

and reports the median decode ms/token of each and the ratios C/A, C/B and D/A, with the load average.
Usage: python scripts/bench_correction.py --data ../shared/data/news-headlines/test.jsonl [--threads 1]
       [--prompts 4] [--tokens 32] [--repeats 5] [--user NAME] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from localpers.engine.decoding import SamplerSettings
from localpers.engine.generation import generate
from localpers.methods.card.choice import stored_choice
from localpers.methods.card.correction import DEFAULT_BIAS_STRENGTH, CardCorrection
from localpers.methods.card.fitting import DEFAULT_PRIOR_WEIGHT
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.card.user_state import stored_token_bias, user_profile
from localpers.tasks import get_task
from localpers.users.store import UserStore

REPO = Path(__file__).resolve().parents[1]


def prompts_from(data: Path, count: int) -> list[str]:
    task = get_task("headline")
    prompts: list[str] = []
    for line in data.read_text(encoding="utf-8").splitlines():
        for query in json.loads(line).get("queries", []):
            prompts.append(task.prompt_for(query["input"]))
            if len(prompts) == count:
                return prompts
    return prompts


def run(args: argparse.Namespace) -> dict[str, object]:
    personalizer = Personalizer.open(model=args.model, bundle=args.bundle, n_threads=args.threads)
    engine = personalizer.engine
    cluster = args.cluster
    vector = DEFAULT_PRIOR_WEIGHT * personalizer.head.default_vector(cluster)
    bias, bias_strength = None, 0.0
    if args.user:  # a fitted user's cluster and vector (from LOCALPERS_HOME)
        user = UserStore().get(args.user)
        fitted_cluster, fitted_vector, state = user_profile(user)
        bias = stored_token_bias(user, state)
        _, chosen_bias, _ = stored_choice(state)
        bias_strength = DEFAULT_BIAS_STRENGTH if chosen_bias is None else chosen_bias
        if fitted_cluster is None or fitted_vector is None:
            raise SystemExit(f"user {args.user!r} has no fitted cluster and vector")
        cluster, vector = fitted_cluster, fitted_vector
    vector = vector * args.vector_scale
    engine.set_adapter(personalizer.adapter_for("card", cluster))
    k = personalizer.head_config.top_k
    strength = personalizer.head_config.default_strength
    end_tokens = [t for t in range(engine.n_vocab) if engine.is_end_of_generation(t)]
    no_end = tuple((t, float("-inf")) for t in end_tokens)
    variants = {
        "plain": (SamplerSettings(logit_bias=no_end), lambda: None),
        "top-k": (SamplerSettings(logit_bias=no_end, top_k=k), lambda: None),
        "card": (
            SamplerSettings(logit_bias=no_end),
            lambda: CardCorrection(personalizer.head, vector, strength, k),
        ),
    }
    if bias is not None and len(bias) and bias_strength:
        variants["card+bias"] = (
            SamplerSettings(logit_bias=no_end),
            lambda: CardCorrection(
                personalizer.head, vector, strength, k, bias=bias, bias_strength=bias_strength
            ),
        )
    prompts = [engine.tokenize(p) for p in prompts_from(Path(args.data), args.prompts)]
    per_variant: dict[str, list[float]] = {name: [] for name in variants}
    changed = 0
    load_before = os.getloadavg()
    started = time.time()
    with threadpool_limits(limits=1, user_api="blas"):
        for settings, method in variants.values():  # warm-up, not timed
            generate(engine, prompts[0], max_tokens=4, sampling=settings, method=method())
        for _ in range(args.repeats):
            for prompt in prompts:
                outputs = {}
                for name, (settings, method) in variants.items():
                    result = generate(
                        engine, prompt, max_tokens=args.tokens, sampling=settings, method=method()
                    )
                    if len(result.tokens) != args.tokens:
                        raise SystemExit(
                            f"{name} stopped after {len(result.tokens)} tokens; the runs would differ"
                        )
                    per_variant[name].append(result.ms_per_token)
                    outputs[name] = result.tokens
                if outputs["plain"] != outputs["top-k"]:
                    raise SystemExit("top-k changed greedy tokens: it must not")
                changed += outputs["card"] != outputs["plain"]
    personalizer.close()
    medians = {name: statistics.median(values) for name, values in per_variant.items()}
    return {
        "threads": engine.n_threads,
        "tokens_per_run": args.tokens,
        "runs_per_variant": len(per_variant["plain"]),
        "top_k": k,
        "cluster": cluster,
        "vector_norm": round(float(np.linalg.norm(vector)), 3),
        "runs_where_card_changed_tokens": changed,
        "median_ms_per_token": {name: round(value, 3) for name, value in medians.items()},
        "ratio_card_to_plain": round(medians["card"] / medians["plain"], 4),
        "ratio_card_to_topk": round(medians["card"] / medians["top-k"], 4),
        "ratio_card_bias_to_plain": (
            round(medians["card+bias"] / medians["plain"], 4) if "card+bias" in medians else None
        ),
        "token_bias_entries": len(bias) if bias is not None else 0,
        "bias_strength": bias_strength if "card+bias" in medians else None,
        "target_ratio": 1.05,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "wall_s": round(time.time() - started, 1),
        "ms_per_token": {name: [round(v, 3) for v in values] for name, values in per_variant.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", required=True, help="a shared-data JSONL file (its first queries are the prompts)"
    )
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32, help="tokens decoded per run")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds over all prompts")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--cluster", type=int, default=0, help="cluster whose default vector is used")
    parser.add_argument("--user", default=None, help="use this fitted user's cluster and vector instead")
    parser.add_argument(
        "--vector-scale", type=float, default=1.0, help="multiplies the cluster's default vector"
    )
    parser.add_argument("--bundle", default=str(REPO / "models" / "demo-bundle"))
    parser.add_argument("--model", default=None, help="backbone GGUF (default: embedded Gemma 3 270M)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for name, value in result["median_ms_per_token"].items():  # type: ignore[union-attr]
        print(f"{name:<9} {value:8.3f} ms/token (median of {result['runs_per_variant']})")
    print(
        f"card / plain {result['ratio_card_to_plain']:.3f}x, card / top-k {result['ratio_card_to_topk']:.3f}x"
    )
    if result["ratio_card_bias_to_plain"] is not None:
        print(f"card+bias / plain {result['ratio_card_bias_to_plain']:.3f}x")
    print(f"load average before {result['load_average_before']}, after {result['load_average_after']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
