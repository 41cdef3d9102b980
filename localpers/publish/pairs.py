"""Stage `pairs`: preference pairs through llama.cpp, the engine the device uses.

For each training user and up to `pairs_per_user` of their training items (a seeded sample; never the
validation items): `y+` = the user's own output, `y-` = the greedy output of the user's cluster
adapter on the same prompt, with the task's stop rule and `max_new_tokens`. Pairs with `y- == y+`
(or an empty `y-`) are skipped. One JSON file per user is written as soon as that user is done, so an
interrupted run picks up at the next user. This stage does not compute features.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import numpy as np

from localpers.publish.clusters import load_assignment
from localpers.publish.prompts import user_prompts
from localpers.publish.runner import PublishContext, read_json, write_json_atomic


def chosen_items(user_id: str, candidates: list[int], limit: int | None, seed: int) -> list[int]:
    if limit is None or len(candidates) <= limit:
        return candidates
    rng = np.random.default_rng([seed, zlib.crc32(user_id.encode()), 1])
    return sorted(int(i) for i in rng.choice(candidates, size=limit, replace=False))


def user_file(directory: Path, index: int) -> Path:
    return directory / f"user-{index:05d}.json"


def run(context: PublishContext, directory: Path) -> dict[str, Any]:
    from localpers.engine import Engine
    from localpers.engine.generation import generate
    from localpers.tasks import get_task

    options = context.options
    task = get_task(options.task)
    assignment = load_assignment(context)
    adapters = context.stage_dir("export")
    plan: list[tuple[int, int, list[int]]] = []
    for index, (user, entry) in enumerate(zip(context.corpus.users, assignment["users"], strict=True)):
        held_out = set(entry["val"])
        candidates = [i for i in range(len(user.history)) if i not in held_out]
        plan.append(
            (
                index,
                int(entry["cluster"]),
                chosen_items(user.user_id, candidates, options.pairs_per_user, options.seed),
            )
        )
    plan.sort(key=lambda row: (row[1], row[0]))  # group by cluster: fewer adapter switches
    engine = Engine(context.backbone_path, tap_layers=None, n_ctx=1024, n_threads=options.engine_threads)
    generated = skipped = new_tokens = 0
    decode_seconds = 0.0
    try:
        for c in range(assignment["k"]):
            engine.load_adapter(adapters / f"cluster-{c}.gguf", f"cluster-{c}")
        todo = [row for row in plan if not user_file(directory, row[0]).exists()]
        with context.progress("pairs (greedy y-)", sum(len(items) for *_, items in todo)) as advance:
            for index, cluster, items in todo:
                user = context.corpus.users[index]
                prompts = user_prompts(context, user)
                engine.set_adapter(f"cluster-{cluster}")
                pairs = []
                for item_index in items:
                    item = user.history[item_index]
                    result = generate(
                        engine,
                        prompts[item_index],
                        max_tokens=options.max_new_tokens,
                        stop=task.stop_strings,
                    )
                    rejected = result.text.strip()
                    generated += 1
                    new_tokens += len(result.tokens)
                    decode_seconds += result.prompt_seconds + result.decode_seconds
                    advance(1)
                    if not rejected or rejected == item.output.strip():
                        skipped += 1
                        continue
                    pairs.append({"item": item_index, "chosen": item.output.strip(), "rejected": rejected})
                write_json_atomic(
                    user_file(directory, index),
                    {"user": index, "user_id": user.user_id, "cluster": cluster, "pairs": pairs},
                )
    finally:
        engine.close()
    per_user = [len(read_json(user_file(directory, row[0]))["pairs"]) for row in plan]
    return {
        "pairs": int(sum(per_user)),
        "generated_this_run": generated,
        "skipped_identical_this_run": skipped,
        "generated_tokens_this_run": new_tokens,
        "ms_per_generated_token": round(1000 * decode_seconds / max(1, new_tokens), 1),
        "users": len(per_user),
        "min_pairs_per_user": int(min(per_user)) if per_user else 0,
    }


def load_pairs(context: PublishContext) -> list[dict[str, Any]]:
    directory = context.stage_dir("pairs")
    return [read_json(path) for path in sorted(directory.glob("user-*.json"))]
