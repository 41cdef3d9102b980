"""Dev-split study: does a per-user choice of which examples the prompt shows beat the device's fixed mix?

The device's prompt shows 4 of the user's most recent headlines and the 1 BM25-closest (RESULTS 0f). Authors
differ: one with a weekly series needs the latest instance, one who covers a beat may be served better by the
closest. This script chooses, per user, among prompt mixes decoded by `decode_variants.py`'s `recent=N`
variants, the way `localpers fit` chooses a correction (`methods.card.choice`): on the user's own most recent
history items (the last 20%, 3 to 10, `choice.split_recent`), each teacher-forced after the prompt the device
would have shown then (examples from the items before it), mean log-probability per token. Unlike the fit, it
scores each item in one batched evaluation (`Engine.score`) rather than through the decode loop; every mix is
scored the same way. It then writes the chosen mix's cached outputs as `OUT/cache/choice/<user>.json`, and the
per-user best mix chosen with the answers as `OUT/cache/oracle-choice/`, a ceiling no device can reach; compare
with `scripts/compare_runs.py RUN:recent=4 RUN:choice`. Last it prints a split-half check of that ceiling: each
author's mix chosen by ROUGE-1 on half of their queries (alternate ones) and scored on the other half, both ways,
against the device's mix on the same queries, with a bootstrap interval over queries (an author with one query
has no half to choose on and is left out of it; the line says how many). If authors had a stable
preference, this would keep much of the ceiling's gain.

It reads the dev split (train authors' most recent queries), never the test file's queries; nothing here is used
by the product.

    python scripts/prompt_choice.py --bundle ../bundle-a --run ../bench-runs/dev29-prompts --mixes 0 2 4 5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from localpers.atomic import atomic_write_text
from localpers.bench.data import load_bench_users
from localpers.methods.card import prompting
from localpers.methods.card.choice import split_recent
from localpers.methods.card.decoding_runs import reference_tokens
from localpers.methods.card.personalizer import Personalizer
from localpers.tasks import get_task
from localpers.users.history_index import HistoryIndex


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data/news-headlines/train.jsonl")
    parser.add_argument("--bundle", required=True)
    parser.add_argument(
        "--run", type=Path, required=True, help="decode_variants.py's output with recent=N runs"
    )
    parser.add_argument("--mixes", type=int, nargs="+", default=[0, 2, 4, 5], help="N of each recent=N run")
    parser.add_argument("--max-queries", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    users = load_bench_users(args.data, dev_split=True, max_queries=args.max_queries)
    personalizer = Personalizer.open(bundle=args.bundle, n_threads=args.threads)
    personalizer.engine.set_adapter("global")
    engine, task = personalizer.engine, get_task("headline")
    scores_path = args.run / "prompt_choice_scores.json"
    scores: dict[str, dict[str, float]] = json.loads(scores_path.read_text()) if scores_path.exists() else {}
    started = time.perf_counter()
    for number, user in enumerate(users, start=1):
        if user.store_name not in scores:
            items = [i for i in user.history if i.task == task.name]
            earlier, recent = split_recent(items)
            totals = dict.fromkeys(args.mixes, 0.0)
            for offset, item in enumerate(recent):
                before = earlier + recent[:offset]
                index = HistoryIndex(task, [(i.input, i.output) for i in before])
                gold = reference_tokens(engine, item.output)
                for mix in args.mixes:
                    shown = dataclasses.replace(personalizer.prompt_format, recent=mix)
                    prompt, _ = prompting.prompt_tokens(engine, task.name, item.input, shown, index)
                    (scored,) = engine.score(prompt, [gold])
                    totals[mix] += float(np.mean(scored.logprobs)) / len(recent)
            scores[user.store_name] = {str(mix): total for mix, total in totals.items()}
            atomic_write_text(scores_path, json.dumps(scores, indent=1))
        print(f"{number}/{len(users)} {user.user_id} {time.perf_counter() - started:.0f}s", flush=True)

    def cached(mix: int, user: str) -> dict:
        return json.loads((args.run / "cache" / f"recent={mix}" / f"{user}.json").read_text())

    chosen_counts = dict.fromkeys(args.mixes, 0)
    oracle_counts = dict.fromkeys(args.mixes, 0)
    agreed = 0
    held_out_gains: list[float] = []
    too_short = sum(1 for user in users if len(user.queries) < 2)
    for user in users:
        name = user.store_name
        by_mix = {mix: cached(mix, name) for mix in args.mixes}
        default = personalizer.prompt_format.recent
        best = max(args.mixes, key=lambda m: (scores[name][str(m)], m == default))
        oracle = max(
            args.mixes,
            key=lambda m: (np.mean([q["rouge1"] for q in by_mix[m]["queries"]]), m == default),
        )
        chosen_counts[best] += 1
        oracle_counts[oracle] += 1
        agreed += best == oracle
        held_out_gains += split_half_gains(by_mix, default)
        for label, mix in (("choice", best), ("oracle-choice", oracle)):
            folder = args.run / "cache" / label
            folder.mkdir(parents=True, exist_ok=True)
            record = dict(by_mix[mix], method=label, chosen=f"recent={mix}")
            atomic_write_text(folder / f"{name}.json", json.dumps(record, indent=1))
    print("chosen by likelihood:", {f"recent={m}": c for m, c in chosen_counts.items()})
    print("chosen with the answers (ceiling):", {f"recent={m}": c for m, c in oracle_counts.items()})
    print(f"the likelihood's choice is the ceiling's for {agreed} of {len(users)} users")
    if not held_out_gains:
        print("split half: no user has two queries to choose on one half and score on the other")
        return
    gains = np.array(held_out_gains)
    resampled = np.random.default_rng(0).choice(gains, size=(10_000, len(gains))).mean(axis=1)
    low, high = np.percentile(resampled, [2.5, 97.5])
    print(
        f"split half: mix chosen on half of a user's queries, scored on the other half: "
        f"{gains.mean():+.4f} R-1 [{low:+.4f}, {high:+.4f}] over {len(gains)} queries"
        + (f" ({too_short} users with one query left out: no half to choose on)" if too_short else "")
    )


def split_half_gains(by_mix: dict[int, dict], default: int) -> list[float]:
    """Per held-out query, R-1 of the mix chosen on the user's other half minus the default mix's; none for a user
    with one query (one half would be empty: nothing to choose on)."""
    rouge = {mix: np.array([q["rouge1"] for q in record["queries"]]) for mix, record in by_mix.items()}
    count = len(rouge[default])
    gains: list[float] = []
    if count < 2:
        return gains
    for half in (0, 1):
        chosen_on = np.arange(count) % 2 == half
        best = max(rouge, key=lambda m: (rouge[m][chosen_on].mean(), m == default))
        gains += list(rouge[best][~chosen_on] - rouge[default][~chosen_on])
    return gains


if __name__ == "__main__":
    main()
