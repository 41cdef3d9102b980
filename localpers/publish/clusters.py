"""Stage `clusters`: embed every training user, choose K, run K-means, split items into train/validation.

A user's embedding is the L2-normalised mean of the sentence embeddings of their outputs. With no `--k`,
K is chosen by the silhouette score (cosine) over `k_range` on the training users and every score is
recorded. Users are embedded in shards of `shard_users` authors through the run's executor. With more
than `minibatch_above` users, K-means is scikit-learn's MiniBatchKMeans and the silhouette is taken on a
seeded sample of users (the exact one is quadratic in users); the outputs are the same files either way.
Centroids are the L2-normalised means of each cluster's members. The per-user validation slice (at
least one item for users with two or more) is drawn here so every later stage agrees on it.
Outputs: `users.npz` (embeddings), `assignment.json`, `centroids.safetensors`.
"""

from __future__ import annotations

import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from localpers.engine.encoder import embed_texts, l2_normalise
from localpers.errors import LocalpersError
from localpers.publish.executor import GIB, Resources, Task, shards
from localpers.publish.runner import ContextSpec, PublishContext, read_json, task_context, write_json_atomic

ASSIGNMENT_FILE = "assignment.json"
CENTROIDS_FILE = "centroids.safetensors"
SILHOUETTE_SAMPLE = 5000


def validation_indices(user_id: str, n_items: int, fraction: float, seed: int) -> list[int]:
    """The held-out item indices of one user: a seeded `fraction` of them, at least 1 when n >= 2."""
    if n_items < 2 or fraction <= 0:
        return []
    n_val = min(n_items - 1, max(1, round(fraction * n_items)))
    rng = np.random.default_rng([seed, zlib.crc32(user_id.encode())])
    return sorted(int(i) for i in rng.choice(n_items, size=n_val, replace=False))


def kmeans(
    embeddings: np.ndarray, k: int, seed: int, minibatch_above: int = 2000
) -> tuple[np.ndarray, np.ndarray]:
    """Labels and L2-normalised centroids of K-means on unit vectors (MiniBatchKMeans for many users)."""
    from sklearn.cluster import KMeans, MiniBatchKMeans
    from sklearn.exceptions import ConvergenceWarning

    with (
        warnings.catch_warnings()
    ):  # too few distinct points is refused below in one line, not a warning block
        warnings.simplefilter("ignore", ConvergenceWarning)
        if len(embeddings) > minibatch_above:
            batch = min(len(embeddings), 4096)
            model = MiniBatchKMeans(n_clusters=k, n_init=3, batch_size=batch, random_state=seed)
            labels = model.fit(embeddings).predict(embeddings).astype(int)
        else:
            labels = KMeans(n_clusters=k, n_init=10, random_state=seed).fit(embeddings).labels_.astype(int)
    if len(set(labels.tolist())) < k:
        raise LocalpersError(f"K-means left a cluster of the {k} empty; lower --k")
    centroids = np.stack([embeddings[labels == c].mean(axis=0) for c in range(k)])
    return labels, l2_normalise(centroids)


def choose_k(
    embeddings: np.ndarray, k_range: tuple[int, int], seed: int, minibatch_above: int = 2000
) -> tuple[int, dict[int, float]]:
    """The K with the best cosine silhouette in `k_range` (inclusive), and every score measured."""
    from sklearn.metrics import silhouette_score

    low, high = k_range
    # K-means cannot fill more clusters than there are distinct users' styles (authors whose outputs embed alike).
    distinct = len(np.unique(embeddings.round(6), axis=0))
    high = min(high, len(embeddings) - 1, distinct)
    if high < low:
        raise LocalpersError(
            f"{len(embeddings)} users ({distinct} distinct by their outputs) are too few to choose K in {k_range};"
            " pass --k"
        )
    scores: dict[int, float] = {}
    for k in range(low, high + 1):
        labels, _ = kmeans(embeddings, k, seed, minibatch_above)
        sample = SILHOUETTE_SAMPLE if len(embeddings) > minibatch_above else None
        scores[k] = float(
            silhouette_score(embeddings, labels, metric="cosine", sample_size=sample, random_state=seed)
        )
    best = max(scores, key=lambda k: (round(scores[k], 6), -k))
    return best, scores


def embed_users(spec: ContextSpec, indices: list[int]) -> np.ndarray:
    """Task: the embeddings (one row per user in `indices`) of a shard of users."""
    context = task_context(spec)
    rows = []
    for index in indices:
        vectors = embed_texts([item.output for item in context.corpus.users[index].history])
        rows.append(l2_normalise(vectors.mean(axis=0)))
    return np.stack(rows).astype(np.float32)


def task_resources(context: PublishContext) -> Resources:
    """What one user-embedding task declares: a CPU and 1 GiB (MiniLM on a shard of users)."""
    return Resources(cpus=1, memory=GIB)


def run(context: PublishContext, directory: Path) -> dict[str, Any]:
    options = context.options
    users = context.corpus.users
    spec = context.spec()
    parts = shards(range(len(users)), options.shard_users)
    tasks = [Task(embed_users, (spec, part), f"embed users {part[0]}-{part[-1]}") for part in parts]
    with context.progress("embedding users", len(users)) as advance:
        blocks = context.executor.map(
            tasks, task_resources(context), on_done=lambda i, _: advance(len(parts[i]))
        )
    matrix = np.concatenate(blocks).astype(np.float32)
    silhouette: dict[int, float] = {}
    if options.k is None:
        k, silhouette = choose_k(matrix, options.k_range, options.seed, options.minibatch_above)
        context.log(
            "silhouette by K: "
            + ", ".join(f"{key}={value:.4f}" for key, value in silhouette.items())
            + f" -> K={k}"
        )
    else:
        k = options.k
        if not 1 <= k <= len(users):
            raise LocalpersError(f"--k {k} needs between 1 and {len(users)} (the number of users)")
    labels, centroids = (
        kmeans(matrix, k, options.seed, options.minibatch_above)
        if k > 1
        else (
            np.zeros(len(users), dtype=int),
            l2_normalise(matrix.mean(axis=0, keepdims=True)),
        )
    )
    from safetensors.numpy import save_file

    save_file({"centroids": centroids.astype(np.float32)}, str(directory / CENTROIDS_FILE))
    np.savez(directory / "users.npz", embeddings=matrix)
    assignment = {
        "k": k,
        "users": [
            {
                "user_id": user.user_id,
                "cluster": int(label),
                "val": validation_indices(
                    user.user_id, len(user.history), options.val_fraction, options.seed
                ),
            }
            for user, label in zip(users, labels, strict=True)
        ],
    }
    write_json_atomic(directory / ASSIGNMENT_FILE, assignment)
    sizes = [int((labels == c).sum()) for c in range(k)]
    context.log(f"K={k}, cluster sizes {sizes}")
    return {
        "k": k,
        "sizes": sizes,
        **({"algorithm": "MiniBatchKMeans"} if len(users) > options.minibatch_above else {}),
        "silhouette": {str(key): round(value, 5) for key, value in silhouette.items()},
        "users": len(users),
        "items": context.corpus.n_items,
        "val_items": sum(len(u["val"]) for u in assignment["users"]),
    }


def load_assignment(context: PublishContext) -> dict[str, Any]:
    return read_json(context.stage_dir("clusters") / ASSIGNMENT_FILE)
