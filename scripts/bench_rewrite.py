"""Whole-rewrite cost per method: wall time of one rewrite as `localpers rewrite` / the TUI / the API run it.

Each rewrite goes through the device's method registry (`Method.rewrite`: the user's state and history index
read, the prompt built, prefill, decode, recasing), so the time includes everything a request costs after the
process has started and the bundle is open. The KV cache, the engine's prefix snapshots and the user's kept
prefix files (`localpers.engine.prefix_files`) are cleared before each rewrite, so every prompt is prefilled (the
engine reuses an identical prompt it has just evaluated, which would favour the second method): the first rewrite
a user ever makes with a history block. With --kept, the user's prefix files stay: what every later one-shot
`localpers rewrite` (a new process, an empty cache) costs once the block is in the user's folder. With --warm, each timed rewrite instead follows an untimed rewrite of another article by the same method and
user: what the second and later rewrites of a session (the TUI, the API, `rewrite` on several texts) cost, with
the user's recent examples already in the engine's cache. Methods are interleaved per article (global, cluster,
card, global, ...), so machine noise hits them alike; the medians, their ratio to the global adapter's, and the prompt and
output token counts are reported.

The user must exist and be fitted (`localpers fit`), e.g. the demo user:

    LOCALPERS_HOME=/tmp/h localpers user create demo
    LOCALPERS_HOME=/tmp/h localpers history import models/demo-user/history.jsonl --user demo
    LOCALPERS_HOME=/tmp/h localpers fit --user demo
    LOCALPERS_HOME=/tmp/h python scripts/bench_rewrite.py --user demo --articles 12 --repeats 3 --json

A method given as NAME@N rewrites with N candidates and keeps their consensus (`localpers rewrite --candidates N`),
e.g. `--methods global card card@16`; NAME:B sets the word-only repetition rule to B nats (`rewrite
--repeated-word-penalty B`; `global:0` is the global adapter without it).

Articles are the demo user's `articles.jsonl`, or with --data the queries of a file in the shared data's format
(each author's `queries`, in file order).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from localpers.bench.data import load_bench_users
from localpers.device.demo import demo_articles
from localpers.engine.decoding import SamplerSettings
from localpers.engine.prefix_files import FILE_PATTERN as PREFIX_FILES
from localpers.methods.base import RewriteOptions
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.registry import BASELINE_METHOD, compared_methods, get_method
from localpers.users.store import UserStore


def read_articles(path: Path | None, limit: int) -> list[str]:
    """The demo user's articles, or the query inputs of a file in the shared data's format (file order)."""
    if path is None:
        return demo_articles()[:limit]
    return [query.input for user in load_bench_users(path) for query in user.queries][:limit]


def run_one(personalizer: Personalizer, user: object, entry: str, text: str) -> dict:
    """One rewrite by `entry` as `localpers rewrite` does it: "card", "card@16" for 16 candidates, "card:0" with
    the word-only repetition rule at 0 nats (off) instead of the task's default."""
    entry, _, words = entry.partition(":")
    name, _, count = entry.partition("@")
    sampling = None if not words else SamplerSettings(repeated_word_penalty=float(words)).validated()
    options = RewriteOptions(candidates=int(count or 1), sampling=sampling)
    return get_method(name).rewrite(personalizer, user, text, options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--user", default="demo")
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--articles", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--methods",
        nargs="+",
        default=None,
        help="default: the compared methods; NAME@N for N candidates, NAME:B for the word rule at B nats",
    )
    cache = parser.add_mutually_exclusive_group()
    cache.add_argument("--warm", action="store_true", help="after a rewrite of another article (see above)")
    cache.add_argument("--kept", action="store_true", help="the user's prefix files kept (see above)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    methods = args.methods or list(compared_methods())
    user = UserStore().get(args.user)
    articles = read_articles(args.data, args.articles)
    personalizer = Personalizer.open(n_threads=args.threads)
    walls: dict[str, list[float]] = {name: [] for name in methods}
    prompt_tokens: dict[str, list[int]] = {name: [] for name in methods}
    output_tokens: dict[str, list[int]] = {name: [] for name in methods}
    prompt_ms: dict[str, list[float]] = {name: [] for name in methods}
    decode_ms: dict[str, list[float]] = {name: [] for name in methods}
    for name in methods:  # warm-up: adapters loaded, history index read once
        run_one(personalizer, user, name, articles[0])
    for _ in range(args.repeats):
        for position, text in enumerate(articles):
            for name in methods:
                # a cold prompt: the engine would otherwise reuse the previous method's identical prefill
                # or the user's examples block it has kept
                personalizer.engine.reset()
                personalizer.engine.prefix_snapshots.clear()
                if not args.kept:
                    for kept_file in user.dir.glob(PREFIX_FILES):
                        kept_file.unlink()
                if args.warm:
                    other = articles[position - 1] if len(articles) > 1 else text + " More."
                    run_one(personalizer, user, name, other)
                started = time.perf_counter()
                payload = run_one(personalizer, user, name, text)
                walls[name].append((time.perf_counter() - started) * 1000)
                prompt_tokens[name].append(int(payload.get("prompt_tokens", 0)))
                output_tokens[name].append(int(payload.get("tokens", 0)))
                prompt_ms[name].append(float(payload.get("prompt_ms", 0.0)))
                decode_ms[name].append(float(payload.get("ms_per_token", 0.0)))
    baseline = statistics.median(walls[BASELINE_METHOD]) if BASELINE_METHOD in walls else None
    rows = {
        name: {
            "median_ms": round(statistics.median(walls[name]), 1),
            "vs_global": None if baseline is None else round(statistics.median(walls[name]) / baseline, 3),
            "prompt_tokens": round(statistics.mean(prompt_tokens[name]), 1),
            "output_tokens": round(statistics.mean(output_tokens[name]), 1),
            "prompt_ms": round(statistics.median(prompt_ms[name]), 1),
            "decode_ms_per_token": round(statistics.median(decode_ms[name]), 2),
            "rewrites": len(walls[name]),
        }
        for name in methods
    }
    if args.json:
        print(
            json.dumps(
                {
                    "user": args.user,
                    "threads": personalizer.engine.n_threads,
                    "cache": "warm" if args.warm else "kept" if args.kept else "cold",
                    "methods": rows,
                },
                indent=2,
            )
        )
        return
    for name, row in rows.items():
        print(
            f"{name:14s} {row['median_ms']:8.1f} ms  x{row['vs_global']}  prompt {row['prompt_tokens']:.0f} tokens,"
            f" output {row['output_tokens']:.0f} tokens ({row['rewrites']} rewrites); prompt {row['prompt_ms']} ms,"
            f" decode {row['decode_ms_per_token']} ms/token"
        )


if __name__ == "__main__":
    main()
