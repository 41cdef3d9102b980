"""Stage `features`: teacher-forced layer features of every pair's `y+` and `y-` through llama.cpp.

With the user's cluster adapter active, `Engine.score(prompt, [tok(" " + y+), tok(" " + y-)])` gives,
for every continuation token, the tapped layers' hidden states that preceded it. They are stored
RMS-normalised per layer and concatenated (`localpers.methods.card.head.normalise_features`), in float16, with the
token ids and the sequence boundaries, one `.npz` per user (resumable per user). This stage does
not train the head.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from localpers.methods.card.head import normalise_features
from localpers.publish.pairs import load_pairs
from localpers.publish.prompts import user_prompts
from localpers.publish.runner import PublishContext


def user_file(directory: Path, index: int) -> Path:
    return directory / f"user-{index:05d}.npz"


def run(context: PublishContext, directory: Path) -> dict[str, Any]:
    from localpers.engine import Engine

    options = context.options
    users = load_pairs(context)
    adapters = context.stage_dir("export")
    engine = Engine(context.backbone_path, n_ctx=1024, n_threads=options.engine_threads)
    k = context.summary("clusters")["k"]
    tokens_total = 0
    try:
        for c in range(k):
            engine.load_adapter(adapters / f"cluster-{c}.gguf", f"cluster-{c}")
        todo = [u for u in users if not user_file(directory, u["user"]).exists()]
        with context.progress("features (llama.cpp taps)", sum(len(u["pairs"]) for u in todo)) as advance:
            for record in todo:
                corpus_user = context.corpus.users[record["user"]]
                prompts = user_prompts(context, corpus_user)
                engine.set_adapter(f"cluster-{record['cluster']}")
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
                    advance(1)
                payload = {
                    "features": np.concatenate(features) if features else np.zeros((0, 0), np.float16),
                    "tokens": np.asarray(tokens, dtype=np.int64),
                    "lengths": np.asarray(lengths, dtype=np.int64),  # 2 per pair: chosen, rejected
                    "items": np.asarray([p["item"] for p in record["pairs"]], dtype=np.int64),
                }
                partial = user_file(directory, record["user"]).with_suffix(".partial.npz")
                np.savez(partial, **payload)
                os.replace(partial, user_file(directory, record["user"]))
    finally:
        engine.close()
    for record in users:
        with np.load(user_file(directory, record["user"])) as data:
            tokens_total += int(data["tokens"].size)
    return {
        "tap_layers": list(engine.tap_layers),
        "n_embd": engine.n_embd,
        "tokens": tokens_total,
        "pairs": sum(len(u["pairs"]) for u in users),
    }
