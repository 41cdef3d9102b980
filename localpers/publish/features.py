"""Stage `features`: teacher-forced layer features of every pair's `y+` and `y-` through llama.cpp.

With the adapter CARD corrects for the user active (`pairs.base_adapter`), `Engine.score(prompt, [tok(" " + y+), tok(" " + y-)])` gives,
for every continuation token, the tapped layers' hidden states that preceded it. They are stored
RMS-normalised per layer and concatenated (`localpers.methods.card.head.normalise_features`), in float16, with the
token ids and the sequence boundaries, one `.npz` per user (resumable per user). Users go in shards of
`shard_users`, one task each, like `pairs`. This stage does not train the head.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from localpers.methods.card.head import normalise_features
from localpers.publish.executor import Task, shards
from localpers.publish.pairs import base_adapter, cluster_engine, load_pairs, release_engines, shard_resources
from localpers.publish.prompts import user_prompts
from localpers.publish.runner import ContextSpec, PublishContext, read_npz, task_context


def user_file(directory: Path, index: int) -> Path:
    return directory / f"user-{index:05d}.npz"


def features_shard(spec: ContextSpec, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Task: the feature file of each user in `records` (pairs-stage records); written users are skipped."""
    context = task_context(spec)
    directory = context.stage_dir("features")
    engine = cluster_engine(context, taps=True)
    for record in records:
        if user_file(directory, record["user"]).exists():
            continue
        corpus_user = context.corpus.users[record["user"]]
        prompts = user_prompts(context, corpus_user)
        engine.set_adapter(base_adapter(context, record["cluster"]))
        features, tokens, lengths = [], [], []
        for pair in record["pairs"]:
            prompt = engine.tokenize(prompts[pair["item"]], add_bos=True)
            continuations = [
                engine.tokenize(" " + pair["chosen"], add_bos=False),
                engine.tokenize(" " + pair["rejected"], add_bos=False),
            ]
            for scored in engine.score(prompt, continuations):
                features.append(normalise_features(scored.features).astype(np.float16))
                tokens.extend(scored.tokens)
                lengths.append(len(scored.tokens))
        payload = {
            "features": np.concatenate(features) if features else np.zeros((0, 0), np.float16),
            "tokens": np.asarray(tokens, dtype=np.int64),
            "lengths": np.asarray(lengths, dtype=np.int64),  # 2 per pair: chosen, rejected
            "items": np.asarray([p["item"] for p in record["pairs"]], dtype=np.int64),
        }
        partial = user_file(directory, record["user"]).with_suffix(".partial.npz")
        np.savez(partial, **payload)
        with partial.open("rb+") as written:  # on disk before the rename: a power cut leaves no empty file
            os.fsync(written.fileno())
        os.replace(partial, user_file(directory, record["user"]))
    return {"tap_layers": list(engine.tap_layers), "n_embd": engine.n_embd}


def run(context: PublishContext, directory: Path) -> dict[str, Any]:
    users = load_pairs(context)
    todo = [u for u in users if not user_file(directory, u["user"]).exists()]
    # The last shard is never empty: it also reports the engine's tap layers when every user is done.
    parts = shards(todo, context.options.shard_users) or [[]]
    spec = context.spec()
    tasks = [Task(features_shard, (spec, part), f"features shard {i}") for i, part in enumerate(parts)]
    with context.progress("features (llama.cpp taps)", sum(len(u["pairs"]) for u in todo)) as advance:
        results = context.executor.map(
            tasks,
            shard_resources(context),
            on_done=lambda i, _: advance(sum(len(u["pairs"]) for u in parts[i])),
        )
    release_engines()
    tokens_total = 0
    for record in users:
        tokens_total += int(
            read_npz(user_file(directory, record["user"]), "features", ("tokens",))["tokens"].size
        )
    return {
        "tap_layers": results[0]["tap_layers"],
        "n_embd": results[0]["n_embd"],
        "tokens": tokens_total,
        "pairs": sum(len(u["pairs"]) for u in users),
    }
