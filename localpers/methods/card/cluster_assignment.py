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


def read_centroids(path: Path, *, k: int | None = None) -> np.ndarray:
    """The bundle's `k` cluster centroids, `(k, 384)` float32, or a one-line error naming the file."""
    from safetensors.numpy import load_file

    from localpers.engine.encoder import ENCODER_DIM

    try:
        centroids = load_file(str(path))["centroids"]
    except Exception as exc:  # safetensors raises several types for a bad file
        raise LocalpersError(f"{path}: unreadable centroids ({exc})") from exc
    expected = f"({'k' if k is None else k}, {ENCODER_DIM})"
    if (
        centroids.ndim != 2
        or centroids.shape[1] != ENCODER_DIM
        or (k is not None and centroids.shape[0] != k)
        or not centroids.shape[0]
    ):
        raise LocalpersError(
            f"{path}: centroids have shape {tuple(centroids.shape)}, the bundle needs {expected}"
        )
    if not np.issubdtype(centroids.dtype, np.floating) or not np.isfinite(centroids).all():
        raise LocalpersError(f"{path}: centroids hold values that are not finite numbers")
    return centroids.astype(np.float32)


def nearest_centroid(centroids: np.ndarray, outputs: Sequence[str]) -> tuple[int, list[float]]:
    """The centroid (cosine) nearest to the mean embedding of `outputs`, and every centroid's similarity."""
    from localpers.engine.encoder import user_embedding

    similarities = centroids @ user_embedding(list(outputs))
    return int(np.argmax(similarities)), [round(float(s), 4) for s in similarities]
