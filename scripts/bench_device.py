"""Device benchmark: CARD decoding cost, fit time, user switch time and bytes per user.

- ms/token: plain decoding (cluster adapter, engine without taps) vs CARD (taps + top-k correction),
  interleaved in one process over the same prompts, medians and their ratio (target <= 1.05x);
- fit seconds for histories of 5/20/50 items (fresh users, so y- generation is included);
- user switch: loading another user's state + vector and activating their cluster adapter;
- bytes per user on disk (vector + state; history and the y- cache reported separately).

Histories come from the first user of --data (shared-data format) when given, else the demo user's.
Usage: python scripts/bench_device.py [--bundle DIR] [--data FILE] [--sizes 5 20 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from localpers.engine import Engine
from localpers.engine.generation import generate
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.card.user_state import user_profile
from localpers.tasks import get_task
from localpers.users.history import HistoryItem, demo_history_path
from localpers.users.history_import import parse_history_file
from localpers.users.store import UserStore

PROMPTS = [
    "The regional rail operator will add late-night trains on weekends starting in June.",
    "A small bakery in the old town has been named the best in the country by a food guide.",
    "Researchers found that a short walk after lunch sharpens focus in the afternoon.",
]


def load_history(data: Path | None) -> list[HistoryItem]:
    if data is None:
        return parse_history_file(demo_history_path())
    first_user = json.loads(data.read_text().splitlines()[0])
    return [HistoryItem.create("headline", item["input"], item["output"]) for item in first_user["history"]]


def decode_cost(
    personalizer: Personalizer, cluster: int, vector, repeats: int, tokens: int
) -> dict[str, float]:
    plain = Engine(personalizer.backbone.path, tap_layers=None)
    adapter = personalizer.bundle.cluster_adapter_name(cluster)
    plain.set_adapter(plain.load_adapter(personalizer.bundle.adapter_path(adapter), adapter))
    task = get_task("free")
    plain_ms, card_ms, cluster_tapped_ms = [], [], []
    for _ in range(repeats):
        for text in PROMPTS:
            prompt = task.prompt_for(text)
            plain_ms.append(generate(plain, prompt, max_tokens=tokens).ms_per_token)
            card = personalizer.rewrite(
                text, task="free", method="card", cluster=cluster, vector=vector, max_tokens=tokens
            )
            card_ms.append(card.ms_per_token)
            tapped = personalizer.rewrite(
                text, task="free", method="cluster", cluster=cluster, max_tokens=tokens
            )
            cluster_tapped_ms.append(tapped.ms_per_token)
    plain.close()
    plain_median, card_median = statistics.median(plain_ms), statistics.median(card_ms)
    return {
        "plain_ms_per_token": round(plain_median, 3),
        "cluster_on_tapped_engine_ms_per_token": round(statistics.median(cluster_tapped_ms), 3),
        "card_ms_per_token": round(card_median, 3),
        "card_vs_plain_ratio": round(card_median / plain_median, 4),
        "runs_per_variant": len(plain_ms),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", default=None, help="bundle directory (default: pulled, else demo bundle)")
    parser.add_argument("--model", default=None, help="backbone GGUF (default: embedded)")
    parser.add_argument("--data", type=Path, default=None, help="shared-data JSONL for histories")
    parser.add_argument("--sizes", type=int, nargs="+", default=[5, 20, 50])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    personalizer = Personalizer.open(model=args.model, bundle=args.bundle)
    history = load_history(args.data)
    results: dict[str, object] = {
        "bundle": str(personalizer.bundle.directory),
        "history_items_available": len(history),
    }
    with tempfile.TemporaryDirectory() as home:
        store = UserStore(Path(home))
        fit_seconds = {}
        for size in args.sizes:
            if size > len(history):
                continue
            user = store.create(f"fit{size}")
            user.save_history(history[-size:])
            started = time.perf_counter()
            report = personalizer.fit_user(user)
            fit_seconds[str(size)] = {
                "seconds": round(time.perf_counter() - started, 2),
                "stages": report.seconds,
            }
        results["fit"] = fit_seconds

        names = store.list()
        cluster, vector, _ = user_profile(store.get(names[-1]))
        results["decode"] = decode_cost(personalizer, cluster, vector, args.repeats, args.tokens)

        switch_ms = []
        for i in range(20):
            started = time.perf_counter()
            other_cluster, other_vector, _ = user_profile(store.get(names[i % len(names)]))
            personalizer.engine.set_adapter(personalizer.adapter_for("card", other_cluster))
            switch_ms.append(1000 * (time.perf_counter() - started))
        results["user_switch_ms"] = round(statistics.median(switch_ms), 3)

        user = store.get(names[-1])
        sizes = {p.name: p.stat().st_size for p in user.dir.iterdir() if p.is_file()}
        results["bytes_per_user"] = {
            "vector_and_state": sum(
                v for k, v in sizes.items() if k.startswith("vector-") or k == "state.json"
            ),
            "history": sizes.get("history.jsonl", 0),
            "negatives_cache": sizes.get("negatives.json", 0),
        }
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        decode = results["decode"]
        print(
            f"decode: plain {decode['plain_ms_per_token']} ms/token, CARD {decode['card_ms_per_token']} ms/token,"
            f" ratio {decode['card_vs_plain_ratio']}x (target <= 1.05x)"
        )
        for size, fit in results["fit"].items():
            print(f"fit {size:>3} items: {fit['seconds']} s  {fit['stages']}")
        print(f"user switch: {results['user_switch_ms']} ms (median of 20)")
        print(f"bytes per user: {results['bytes_per_user']}")
    personalizer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
