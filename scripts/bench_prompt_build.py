"""Time building the device's history prompt, without series, with the series rule unguarded, and with its guard.

`HistoryIndex.prompt_for` over 50 dev-split texts for histories of the first N train-author items, each variant
timed in turn, repeated, and the best mean kept (ms per prompt). The unguarded rule is the guard replaced by one
that always agrees (RESULTS 0zn before 0zo). Run it on a quiet machine; it loads no model.

    python scripts/bench_prompt_build.py ../shared/data/news-headlines/train.jsonl --sizes 100 1000
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from pathlib import Path

import localpers.users.history_prompt as history_prompt
from localpers.bench.data import load_bench_users
from localpers.tasks import get_task
from localpers.users.history_index import HistoryIndex
from localpers.users.history_prompt import PromptFormat
from localpers.users.series import MIN_SIZE, about_series

DEVICE_PLAIN = PromptFormat(examples=5, recent=4)
DEVICE_SERIES = PromptFormat(examples=5, recent=4, series=MIN_SIZE)


def always(*_: object) -> bool:
    return True


VARIANTS: dict[str, tuple[PromptFormat, Callable[..., bool]]] = {
    "no series": (DEVICE_PLAIN, about_series),
    "series, unguarded": (DEVICE_SERIES, always),
    "series, guarded (device)": (DEVICE_SERIES, about_series),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--texts", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    task = get_task("headline")
    users = load_bench_users(args.data, dev_split=True)
    items = [(i.input, i.output) for user in users for i in user.history if i.task == task.name]
    texts = random.Random(0).sample([q.input for user in users for q in user.queries], args.texts)
    for size in args.sizes:
        index = HistoryIndex(task, items[:size])
        best = dict.fromkeys(VARIANTS, float("inf"))
        for _ in range(args.repeats):
            for name, (prompt_format, guard) in VARIANTS.items():
                history_prompt.about_series = guard
                started = time.perf_counter()
                for text in texts:
                    index.prompt_for(text, prompt_format)
                best[name] = min(best[name], 1000 * (time.perf_counter() - started) / len(texts))
        history_prompt.about_series = about_series
        print(f"{size} items: " + ", ".join(f"{name} {ms:.2f} ms" for name, ms in best.items()))


if __name__ == "__main__":
    main()
