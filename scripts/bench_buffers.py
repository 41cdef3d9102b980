"""Benchmark: plain greedy decoding under each CPU buffer setting (LOCALPERS_CPU_BUFFERS), in one process.

One engine per setting (auto, repack, plain; `all` is added with --all, never on an AMX CPU), runs
interleaved (auto, repack, plain, auto, ...) over the same prompt and token count so machine noise hits
all alike. Reports median decode ms/token, prompt prefill ms, the ratio of each to `auto`, which buffer
types the weights got, and whether the greedy tokens agree with `auto`'s.
Usage: python scripts/bench_buffers.py [--tokens 48] [--repeats 7] [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from localpers.engine import Engine
from localpers.engine.backbone import resolve_backbone
from localpers.engine.cpu_buffers import ENV_VAR
from localpers.engine.generation import generate

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle. Once upon a time,"
# About 150 tokens, the length of a history-conditioned headline prompt: what prefill costs in a rewrite.
LONG_PROMPT = (
    "Headlines this author wrote before:\n- City Council Approves New Bike Lanes Downtown\n"
    "- Why Your Morning Coffee Might Be Making You Tired\n- The 10 Best Hikes Within An Hour Of The City\n"
    "- Local Bakery Wins National Award For Its Sourdough\n- What Experts Say About The New School Schedule\n\n"
    "Generate a headline for the following article: The regional rail operator will add late-night trains on"
    " weekends starting next month, after a year of complaints from riders who work evening shifts in the"
    " city centre and could not get home after eleven. The change costs the operator about four million a"
    " year, which it says it will cover from higher ticket sales on the busiest lines.\nHeadline:"
)


def run(tokens: int, repeats: int, threads: int | None, settings: list[str]) -> dict[str, object]:
    backbone = resolve_backbone(None)
    engines: dict[str, Engine] = {}
    for setting in settings:
        os.environ[ENV_VAR] = setting
        engines[setting] = Engine(backbone.path, tap_layers=None, n_threads=threads)
    os.environ.pop(ENV_VAR, None)
    prompt = engines[settings[0]].tokenize(PROMPT)
    long_prompt = engines[settings[0]].tokenize(LONG_PROMPT)
    decode_ms: dict[str, list[float]] = {s: [] for s in settings}
    prefill_ms: dict[str, list[float]] = {s: [] for s in settings}
    outputs: dict[str, list[int]] = {}
    for engine in engines.values():
        generate(engine, prompt, max_tokens=8)  # warm-up
    for _ in range(repeats):
        for setting, engine in engines.items():
            engine.reset()
            start = time.perf_counter()
            engine.eval(long_prompt)
            prefill_ms[setting].append((time.perf_counter() - start) * 1000)
            engine.reset()
            result = generate(engine, prompt, max_tokens=tokens)
            decode_ms[setting].append(result.ms_per_token)
            outputs[setting] = result.tokens
    base = settings[0]
    report: dict[str, object] = {
        "backbone": backbone.path.name,
        "prompt_tokens": len(prompt),
        "prefill_prompt_tokens": len(long_prompt),
        "tokens_per_run": tokens,
        "repeats": repeats,
        "threads": engines[base].n_threads,
        "settings": {},
    }
    for setting, engine in engines.items():
        decode = statistics.median(decode_ms[setting])
        prefill = statistics.median(prefill_ms[setting])
        same = sum(a == b for a, b in zip(outputs[setting], outputs[base], strict=False))
        report["settings"][setting] = {  # type: ignore[index]
            "reason": engine.buffer_choice.reason,
            "weights_mib": engine.weight_buffers,
            "decode_ms_per_token": round(decode, 3),
            "prefill_ms": round(prefill, 2),
            "decode_ratio_to_" + base: round(decode / statistics.median(decode_ms[base]), 4),
            "prefill_ratio_to_" + base: round(prefill / statistics.median(prefill_ms[base]), 4),
            "greedy_tokens_equal_to_" + base: f"{same}/{len(outputs[base])}",
        }
        engine.close()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--all", action="store_true", help="also llama.cpp's own choice (crashes on AMX CPUs)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    settings = ["auto", "repack", "plain"] + (["all"] if args.all else [])
    report = run(args.tokens, args.repeats, args.threads, settings)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for setting, row in report["settings"].items():  # type: ignore[union-attr]
        print(
            f"{setting:<7} decode {row['decode_ms_per_token']:7.2f} ms/token  prefill {row['prefill_ms']:7.1f} ms"
            f"  weights {row['weights_mib']}  greedy equal {row['greedy_tokens_equal_to_auto']}"
        )


if __name__ == "__main__":
    main()
