"""Benchmark: where CARD's correction spends a decoding step, part by part, without a profiler's overhead.

Wraps the parts of `CardCorrection.apply` (the cut to the top k plus the user's habitual tokens, the top-k scan,
the head's correction, its projection and `U` rows, the token bias) and the sampler chain's run with
`time.perf_counter` timers, rewrites the first --articles test queries for each --users user (their fitted cluster,
vector and token bias, the bias at --bias-strength), and prints each part's calls and mean milliseconds a call. The
`U` rows are split into steps whose tokens were all cached already and steps that had to compute some.

A profiler (cProfile) inflates every Python call; these timers add ~1 microsecond a call. The parts nest (the cut
holds the scan, the head holds the projection and the rows), so they do not add up to the total. Users must exist
and be fitted (docs/PERFORMANCE.md, twenty-first session).

Usage: LOCALPERS_HOME=/tmp/h python scripts/bench_correction_parts.py --data ../shared/data/news-headlines/test.jsonl
       [--users u003 demo] [--articles 20] [--bias-strength 0.1] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localpers.bench.data import load_bench_users
from localpers.engine.decoding import Candidates
from localpers.engine.sampler_chain import SamplerChain
from localpers.methods.card.correction import CardCorrection
from localpers.methods.card.head import CardHead
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.card.token_bias import TokenBias
from localpers.methods.card.user_state import stored_token_bias, user_profile
from localpers.tasks import get_task
from localpers.users.store import UserStore

seconds: dict[str, float] = defaultdict(float)
calls: dict[str, int] = defaultdict(int)


def timed(owner: type, attribute: str, part: str) -> None:
    """Replace `owner.attribute` with the same function, its calls timed under `part`."""
    original: Callable[..., Any] = getattr(owner, attribute)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            seconds[part] += time.perf_counter() - started
            calls[part] += 1

    setattr(owner, attribute, wrapper)


def time_u_rows() -> None:
    """Time `CardHead._factored_rows`, split by whether every asked-for row was cached."""
    original = CardHead._factored_rows

    def wrapper(head: CardHead, ids: Any) -> Any:
        slots = head._row_slots
        part = (
            "U rows, all cached" if slots is not None and not (slots[ids] < 0).any() else "U rows, some new"
        )
        started = time.perf_counter()
        try:
            return original(head, ids)
        finally:
            seconds[part] += time.perf_counter() - started
            calls[part] += 1

    CardHead._factored_rows = wrapper  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--users", nargs="+", default=["u003", "demo"])
    parser.add_argument("--articles", type=int, default=20)
    parser.add_argument("--bias-strength", type=float, default=0.1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    timed(SamplerChain, "_run", "sampler chain")
    timed(CardCorrection, "apply", "correction")
    timed(CardCorrection, "_cut_with_habits", "cut: top k + habits")
    timed(Candidates, "best_positions", "top-k scan")
    timed(TokenBias, "habitual_tokens", "habitual tokens")
    timed(CardHead, "correction", "head")
    timed(CardHead, "project", "head projection")
    timed(TokenBias, "apply", "token bias")
    time_u_rows()

    queries = [q for user in load_bench_users(args.data) for q in user.queries][: args.articles]
    personalizer = Personalizer.open(n_threads=args.threads)
    store = UserStore()
    task = get_task("headline")
    for name in args.users:
        user = store.get(name)
        cluster, vector, state = user_profile(user)
        bias = stored_token_bias(user, state)
        history = user.history_index(task)
        for query in queries:
            personalizer.rewrite(
                query.input,
                method="card",
                cluster=cluster,
                vector=vector,
                bias=bias,
                bias_strength=args.bias_strength,
                history=history,
            )
    rows = {
        part: {"calls": calls[part], "ms": round(1000 * seconds[part] / calls[part], 3)} for part in seconds
    }
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for part, row in rows.items():
        print(f"{part:22s} {row['calls']:6d} calls  {row['ms']:.3f} ms a call")


if __name__ == "__main__":
    main()
