"""Stage `pairs`: preference pairs through llama.cpp, the engine the device uses.

For each training user and up to `pairs_per_user` of their training items (a seeded sample; never the
validation items): `y+` = the user's own output, `y-` = the greedy output of the adapter CARD will
correct for that user (`--card-base`: the user's cluster adapter, or the global one) on the same prompt, with
the task's stop rule and `max_new_tokens`. Pairs with `y- == y+` (or an empty `y-`) are skipped. Authors are
cut into shards of `shard_users` (grouped by cluster: fewer adapter switches), one task each; a task writes one JSON file per user as soon as that user is done, so
an interrupted or retried task picks up at the next user. Each process keeps one llama.cpp engine with
every adapter loaded (`cluster_engine`, shared with `features`). This stage does not compute
features.
"""

from __future__ import annotations

import atexit
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from localpers.publish.clusters import load_assignment
from localpers.publish.executor import GIB, Resources, Task, shards
from localpers.publish.options import card_base
from localpers.publish.prompts import user_prompts
from localpers.publish.runner import (
    ContextSpec,
    PublishContext,
    read_finished_json,
    read_json,
    task_context,
    write_json_atomic,
)

_engines: dict[tuple[Any, ...], Any] = {}
USER_FIELDS = ("user", "user_id", "cluster", "pairs")  # what a user's file holds once written


def chosen_items(user_id: str, candidates: list[int], limit: int | None, seed: int) -> list[int]:
    if limit is None or len(candidates) <= limit:
        return candidates
    rng = np.random.default_rng([seed, zlib.crc32(user_id.encode()), 1])
    return sorted(int(i) for i in rng.choice(candidates, size=limit, replace=False))


def user_file(directory: Path, index: int) -> Path:
    return directory / f"user-{index:05d}.json"


def shard_resources(context: PublishContext) -> Resources:
    """A pairs/features shard: `engine_threads` CPUs and half an SFT task's memory (llama.cpp, Q4 backbone)."""
    return Resources(
        cpus=context.options.engine_threads, memory=int(context.options.task_memory_gb * GIB / 2)
    )


def cluster_engine(context: PublishContext, *, taps: bool) -> Any:
    """This process's llama.cpp engine with every exported adapter loaded (`global`, `cluster-<c>`)."""
    from localpers.engine import CONTEXT_TOKENS, Engine

    key = (str(context.backbone_path), context.options.engine_threads, taps, context.keys.get("export"))
    if key not in _engines:
        for old in _engines.values():
            old.close()
        _engines.clear()
        kwargs: dict[str, Any] = {} if taps else {"tap_layers": None}
        engine = Engine(
            context.backbone_path, n_ctx=CONTEXT_TOKENS, n_threads=context.options.engine_threads, **kwargs
        )
        adapters = context.stage_dir("export")
        engine.load_adapter(adapters / "global.gguf", "global")
        for c in range(context.summary("clusters")["k"]):
            engine.load_adapter(adapters / f"cluster-{c}.gguf", f"cluster-{c}")
        atexit.register(engine.close)  # before interpreter teardown, while llama_cpp is importable
        _engines[key] = engine
    return _engines[key]


def base_adapter(context: PublishContext, cluster: int) -> str:
    """The adapter whose outputs are a user's y- (and whose states the head is trained on): `--card-base`."""
    return "global" if card_base(context.options) == "global" else f"cluster-{cluster}"


def release_engines() -> None:
    """Close this process's cached engine (the driver calls it when a stage is done with it)."""
    for engine in _engines.values():
        engine.close()
    _engines.clear()


def pairs_shard(spec: ContextSpec, rows: list[tuple[int, int, list[int]]]) -> dict[str, float]:
    """Task: the pairs of a shard of `(user, cluster, items)` rows; users already written are skipped."""
    from localpers.engine.generation import generate
    from localpers.tasks import get_task

    context = task_context(spec)
    options = context.options
    directory = context.stage_dir("pairs")
    task = get_task(options.task)
    engine = cluster_engine(context, taps=False)
    stats = {"generated": 0, "skipped": 0, "too_long": 0, "new_tokens": 0, "decode_seconds": 0.0}
    for index, cluster, items in rows:
        if user_file(directory, index).exists():
            continue
        user = context.corpus.users[index]
        prompts = user_prompts(context, user)
        engine.set_adapter(base_adapter(context, cluster))
        pairs = []
        for item_index in items:
            item = user.history[item_index]
            if not fits_context(engine, prompts[item_index], item.output, options.max_new_tokens):
                # a text that tokenizes densely (another script, a URL, many examples) stopped the whole stage
                # with "text too long", hours in and at every rerun; left out as the device's fit leaves it out
                context.log(
                    f"{context.corpus.path}:{user.line}: history[{item_index}] of user {user.user_id!r} leaves no"
                    f" room in the model's context for its y- ({engine.n_ctx} tokens); left out of the pairs"
                )
                stats["too_long"] += 1
                continue
            result = generate(
                engine, prompts[item_index], max_tokens=options.max_new_tokens, stop=task.stop_strings
            )
            rejected = result.text.strip()
            stats["generated"] += 1
            stats["new_tokens"] += len(result.tokens)
            stats["decode_seconds"] += result.prompt_seconds + result.decode_seconds
            if not rejected or rejected == item.output.strip():
                stats["skipped"] += 1
                continue
            pairs.append({"item": item_index, "chosen": item.output.strip(), "rejected": rejected})
        write_json_atomic(
            user_file(directory, index),
            {"user": index, "user_id": user.user_id, "cluster": cluster, "pairs": pairs},
        )
    return stats


def fits_context(engine: Any, prompt: str, chosen: str, max_new_tokens: int) -> bool:
    """Whether the item's prompt leaves room for its y- (`max_new_tokens`) and its own output, which the features
    stage scores after the same prompt."""
    room = max(max_new_tokens, len(engine.tokenize(" " + chosen.strip(), add_bos=False)))
    return len(engine.tokenize(prompt, add_bos=True)) + room <= engine.n_ctx


def run(context: PublishContext, directory: Path) -> dict[str, Any]:
    options = context.options
    assignment = load_assignment(context)
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
    # a damaged user file is removed here and made again; the shards then skip the users whose files exist
    todo = [
        row for row in plan if read_finished_json(context, user_file(directory, row[0]), USER_FIELDS) is None
    ]
    parts = shards(todo, options.shard_users)
    spec = context.spec()
    tasks = [Task(pairs_shard, (spec, part), f"pairs users {part[0][0]}..{part[-1][0]}") for part in parts]
    with context.progress("pairs (greedy y-)", sum(len(items) for *_, items in todo)) as advance:
        results = context.executor.map(
            tasks, shard_resources(context), on_done=lambda i, _: advance(sum(len(r[2]) for r in parts[i]))
        )
    release_engines()
    generated = sum(int(r["generated"]) for r in results)
    new_tokens = sum(int(r["new_tokens"]) for r in results)
    decode_seconds = sum(float(r["decode_seconds"]) for r in results)
    per_user = [len(read_json(user_file(directory, row[0]))["pairs"]) for row in plan]
    return {
        "pairs": int(sum(per_user)),
        "generated_this_run": generated,
        "skipped_identical_this_run": sum(int(r["skipped"]) for r in results),
        "too_long_this_run": sum(int(r.get("too_long", 0)) for r in results),
        "generated_tokens_this_run": new_tokens,
        "ms_per_generated_token": round(1000 * decode_seconds / max(1, new_tokens), 1),
        "users": len(per_user),
        "min_pairs_per_user": int(min(per_user)) if per_user else 0,
    }


def load_pairs(context: PublishContext) -> list[dict[str, Any]]:
    directory = context.stage_dir("pairs")
    return [read_json(path) for path in sorted(directory.glob("user-*.json"))]
