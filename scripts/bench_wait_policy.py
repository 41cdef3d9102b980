"""Benchmark: llama.cpp's speed when other programs keep the CPU busy, under each OpenMP wait policy.

llama-cpp-python builds llama.cpp with OpenMP, and llama.cpp's threads meet at an OpenMP barrier hundreds of
times per token. How a thread waits there is libgomp's wait policy, read once when libgomp loads: by default it
spins up to 300,000 times before it sleeps. On a quiet machine that is fastest; when another program holds one
of the cores the thread llama.cpp waits for is not running, and the waiting one spins away its time slice at
every barrier. This times greedy decoding (ms/token) and a prompt's prefill (ms/prompt token) in one fresh
process per policy and measurement, beside nothing, 1 or 2 busy-looping processes, or another llama.cpp
process decoding under the same policy (two localpers commands at once), the policies alternating within
each round; it prints medians. `localpers.engine.threads` sets the product's policy; this script sets
the environment of each child explicitly, so every row is the policy it names.

Usage: python scripts/bench_wait_policy.py [--beside nothing busy busy2 localpers] [--rounds 3] [--tokens 24]
    [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PROMPT = (
    "Generate a headline for the following article: The city council voted on Tuesday to extend the library's "
    "opening hours through the winter, after a petition signed by more than two thousand residents asked for "
    "evening access to its reading rooms, computers and children's section. "
)
DEFAULT_SPINS = (300_000, 10_000, 1_000, 100, 0)  # 300,000 is libgomp's default; 0 is OMP_WAIT_POLICY=PASSIVE


def policies(spins: list[int]) -> dict[str, dict[str, str]]:
    """Each wait policy's name and the environment that gives it."""
    named = {}
    for count in spins:
        if count == 0:
            named["passive (sleep at once)"] = {"OMP_WAIT_POLICY": "PASSIVE"}
        else:
            suffix = " (libgomp's default)" if count == 300_000 else ""
            named[f"spin {count:,}{suffix}"] = {"GOMP_SPINCOUNT": str(count)}
    return named


BUSY_LOOP = [sys.executable, "-c", "while True:\n    pass\n"]
NEIGHBOURS = ("nothing", "busy", "busy2", "localpers")


def load_engine(threads: int):  # noqa: ANN201 (the engine type stays a lazy import)
    """The product's engine with its layer taps on, as CARD runs it."""
    from localpers.engine import Engine
    from localpers.engine.backbone import resolve_backbone

    return Engine(resolve_backbone(None).path, n_threads=threads)


def measure(engine, tokens: int) -> dict[str, float]:  # noqa: ANN001
    """ms per decoded token and ms per prefilled prompt token on `engine`."""
    prompt = engine.tokenize(PROMPT * 3)
    engine.prefill(prompt[:8])  # warm-up
    started = time.perf_counter()
    step = engine.prefill(prompt)
    prefill_ms = (time.perf_counter() - started) * 1000 / len(prompt)
    started = time.perf_counter()
    for _ in range(tokens):
        step = engine.step(int(step.logits.argmax()))
    decode_ms = (time.perf_counter() - started) * 1000 / tokens
    return {"decode_ms_per_token": decode_ms, "prefill_ms_per_token": prefill_ms}


def _policy_env(policy: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(policy)
    return env


def run_child(policy: dict[str, str], tokens: int, threads: int) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", "--tokens", str(tokens), "--threads", str(threads)]
    output = subprocess.run(
        command, env=_policy_env(policy), capture_output=True, text=True, check=True, timeout=1800
    )
    return json.loads(output.stdout.strip().splitlines()[-1])


def start_neighbours(kind: str, policy: dict[str, str], threads: int) -> list[subprocess.Popen[bytes]]:
    """The processes that keep the CPU busy while one measurement runs."""
    if kind == "localpers":
        command = [sys.executable, __file__, "--child", "--forever", "--threads", str(threads)]
        return [subprocess.Popen(command, env=_policy_env(policy), stdout=subprocess.DEVNULL)]
    count = {"nothing": 0, "busy": 1, "busy2": 2}[kind]
    return [subprocess.Popen(BUSY_LOOP) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beside", nargs="+", choices=NEIGHBOURS, default=list(NEIGHBOURS))
    parser.add_argument("--spins", type=int, nargs="+", default=list(DEFAULT_SPINS), help="0 = passive")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument(
        "--threads", type=int, default=None, help="default: the product's (LOCALPERS_THREADS, else all CPUs)"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--forever", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.threads is None:
        from localpers.engine.threads import default_threads

        args.threads = default_threads()
    if args.child:
        engine = load_engine(args.threads)  # once: a neighbour keeps decoding, not loading
        while args.forever:
            measure(engine, args.tokens)
        print(json.dumps(measure(engine, args.tokens)))
        return

    chosen = policies(args.spins)
    rows = []
    for beside in args.beside:
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in chosen}
        for _ in range(args.rounds):
            for name, policy in chosen.items():
                neighbours = start_neighbours(beside, policy, args.threads)
                try:
                    samples[name].append(run_child(policy, args.tokens, args.threads))
                finally:
                    for process in neighbours:
                        process.kill()
                        process.wait()
        for name, runs in samples.items():
            rows.append(
                {
                    "beside": beside,
                    "policy": name,
                    "decode_ms_per_token": statistics.median(r["decode_ms_per_token"] for r in runs),
                    "prefill_ms_per_token": statistics.median(r["prefill_ms_per_token"] for r in runs),
                    "rounds": len(runs),
                }
            )
    if args.json:
        print(json.dumps({"threads": args.threads, "tokens": args.tokens, "rows": rows}, indent=2))
        return
    print(
        f"llama.cpp threads: {args.threads}; medians of {args.rounds} fresh processes; {args.tokens} tokens"
    )
    print("| beside it | wait policy | decode ms/token | prefill ms/prompt token |")
    print("|---:|---|---:|---:|")
    for row in rows:
        print(
            f"| {row['beside']} | {row['policy']} | {row['decode_ms_per_token']:.1f} |"
            f" {row['prefill_ms_per_token']:.2f} |"
        )


if __name__ == "__main__":
    main()
