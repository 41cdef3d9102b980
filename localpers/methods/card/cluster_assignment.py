"""Which of the bundle's style clusters a user belongs to: the nearest centroid to their mean output embedding.

The centroids are the publisher's (`clusters.centroids` of the bundle, a safetensors file); the user's outputs
are embedded on the device by the local sentence encoder (`localpers.engine.encoder`), so nothing leaves it.
This module reads and compares; it decides nothing about adapters or corrections.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from localpers.errors import LocalpersError


def read_centroids(path: Path) -> np.ndarray:
    """The bundle's cluster centroids, `(k, d)` float32, or a one-line error naming the file."""
    from safetensors.numpy import load_file

    try:
        return load_file(str(path))["centroids"].astype(np.float32)
    except Exception as exc:  # safetensors raises several types for a bad file
        raise LocalpersError(f"{path}: unreadable centroids ({exc}); re-pull") from exc


def nearest_centroid(centroids: np.ndarray, outputs: Sequence[str]) -> tuple[int, list[float]]:
    """The centroid (cosine) nearest to the mean embedding of `outputs`, and every centroid's similarity."""
    from localpers.engine.encoder import user_embedding

    similarities = centroids @ user_embedding(list(outputs))
    return int(np.argmax(similarities)), [round(float(s), 4) for s in similarities]
