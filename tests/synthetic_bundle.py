"""A small but real bundle for device tests: random LoRA adapters, a random head, real centroids.

It exercises every code path of the device (verification, adapters in llama.cpp, taps, head maths)
without the publisher's hours of training. Centroids come from the real sentence encoder applied to
two invented writing styles, so cluster assignment is meaningful.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from localpers.bundle.format import write_manifest
from localpers.engine.adapters import random_lora
from localpers.engine.backbone import Backbone
from localpers.methods.card.head import CardHead
from localpers.methods.card.head_spec import HeadConfig

SHOUTY_OUTPUTS = ["BIG WIN FOR CITY PARK!!!", "MAYOR SAYS YES TO BUSES!!!", "STORM HITS COAST, ALL SAFE!!!"]
CALM_OUTPUTS = [
    "a quiet note on the new park",
    "the council and the buses, explained gently",
    "after the storm, a slow morning on the coast",
]


def make_bundle(
    directory: Path,
    backbone: Backbone,
    *,
    d: int = 16,
    seed: int = 0,
    prompt: dict | None = None,
    base: str = "cluster",
) -> Path:
    """Write a verified-format bundle with k=2 clusters into `directory` and return it.

    `prompt` is the manifest's history-prompt entry (None: a plain-prompt bundle); `base` the adapter CARD corrects.
    """
    from localpers.engine.encoder import user_embedding

    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    adapters = {}
    for index, name in enumerate(("global", "cluster-0", "cluster-1")):
        random_lora(
            backbone.path, directory / "adapters" / f"{name}.gguf", rank=2, std=0.03, seed=seed + index
        )
        adapters[name] = f"adapters/{name}.gguf"
    centroids = np.stack([user_embedding(SHOUTY_OUTPUTS), user_embedding(CALM_OUTPUTS)]).astype(np.float32)
    save_file({"centroids": centroids}, str(directory / "centroids.safetensors"))
    config = HeadConfig(d=d, alpha=1.0, top_k=10, base=base)
    head = CardHead(
        config,
        rng.normal(0.0, 1.0 / np.sqrt(4 * 640), size=(d, 4 * 640)),
        np.zeros((3, d), dtype=np.float32),
        factor_q=rng.normal(0.0, 1.0, size=(640, d)),
        embeddings=_NoEmbeddings(),
    )
    head.save(directory / "head.safetensors")
    write_manifest(
        directory,
        {
            "created": "test",
            "backbone": {"name": backbone.path.stem, "sha256": backbone.sha256, "n_embd": 640, "n_layer": 18},
            "encoder": {"id": "sentence-transformers/all-MiniLM-L6-v2", "dim": int(centroids.shape[1])},
            "task": "headline",
            **({"prompt": prompt} if prompt is not None else {}),
            "clusters": {"k": 2, "centroids": "centroids.safetensors", "sizes": [1, 1]},
            "adapters": adapters,
            "head": {"file": "head.safetensors", **config.to_manifest()},
            "data_card": {"source": "synthetic test data", "licence": "none", "users": 2, "items": 6},
            "training": {},
        },
    )
    return directory


class _NoEmbeddings:
    """Stands in for TokenEmbeddings while saving: the head file does not contain E."""

    def rows(self, ids: np.ndarray) -> np.ndarray:  # pragma: no cover - never called while saving
        raise AssertionError("not used")
