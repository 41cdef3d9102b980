"""The head stage's training data: every pair's stored features as flat arrays, and which pairs to use.

`load_pair_data` reads the `features` stage's per-user files into one `PairData` (sequence 2p is pair
p's y+, 2p+1 its y-); `holdout_mask` picks the seeded held-out pairs; `author_negative_pairs` pairs an
author's y+ with same-cluster authors' y+ for the author-vs-author comparisons. No training here
(see `head_training`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from localpers.errors import LocalpersError
from localpers.publish.features import user_file
from localpers.publish.pairs import load_pairs
from localpers.publish.runner import PublishContext, read_npz


@dataclass
class PairData:
    """All sequences of all pairs, flattened: sequence 2p is pair p's y+, 2p+1 its y-."""

    features: np.ndarray  # (N, n_taps * n_embd) float16, normalised
    tokens: np.ndarray  # (N,)
    sequence: np.ndarray  # (N,) sequence index of each token
    lengths: np.ndarray  # (n_seq,)
    pair_user: np.ndarray  # (n_pairs,) training-user row
    pair_cluster: np.ndarray  # (n_pairs,)
    user_ids: list[str]
    user_cluster: np.ndarray  # (n_users,)

    @property
    def n_pairs(self) -> int:
        return len(self.pair_user)


def load_pair_data(context: PublishContext) -> PairData:
    directory = context.stage_dir("features")
    features, tokens, lengths, pair_user, pair_cluster, user_ids, user_cluster = [], [], [], [], [], [], []
    for record in load_pairs(context):
        data = read_npz(user_file(directory, record["user"]), "features")
        if data["tokens"].size == 0:
            continue
        row = len(user_ids)
        user_ids.append(record["user_id"])
        user_cluster.append(record["cluster"])
        features.append(data["features"])
        tokens.append(data["tokens"])
        lengths.append(data["lengths"])
        n_pairs = len(data["lengths"]) // 2
        pair_user.extend([row] * n_pairs)
        pair_cluster.extend([record["cluster"]] * n_pairs)
    if not lengths:
        raise LocalpersError(
            "no preference pairs to train the head on: every user's y- was empty or equal to their headline;"
            " check the corpus's outputs, or raise --max-new-tokens / --pairs-per-user"
        )
    all_lengths = np.concatenate(lengths)
    return PairData(
        features=np.concatenate(features),
        tokens=np.concatenate(tokens),
        sequence=np.repeat(np.arange(len(all_lengths)), all_lengths),
        lengths=all_lengths,
        pair_user=np.asarray(pair_user),
        pair_cluster=np.asarray(pair_cluster),
        user_ids=user_ids,
        user_cluster=np.asarray(user_cluster),
    )


def author_negative_pairs(data: PairData, eligible: np.ndarray, per_pair: int, seed: int) -> np.ndarray:
    """(pair, other pair) rows: each eligible pair against `per_pair` eligible pairs of other same-cluster users."""
    rng = np.random.default_rng([seed, 3])
    rows: list[tuple[int, int]] = []
    if per_pair <= 0:
        return np.zeros((0, 2), dtype=np.int64)
    for p in np.flatnonzero(eligible):
        others = np.flatnonzero(
            eligible & (data.pair_cluster == data.pair_cluster[p]) & (data.pair_user != data.pair_user[p])
        )
        if len(others) == 0:
            continue
        for q in rng.choice(others, size=min(per_pair, len(others)), replace=False):
            rows.append((int(p), int(q)))
    return np.asarray(rows, dtype=np.int64).reshape(-1, 2)


def holdout_mask(data: PairData, fraction: float, seed: int) -> np.ndarray:
    """True for held-out pairs: a seeded `fraction` of each user's pairs, at least one if they have two."""
    held = np.zeros(data.n_pairs, dtype=bool)
    for row, user_id in enumerate(data.user_ids):
        indices = np.flatnonzero(data.pair_user == row)
        if len(indices) < 2 or fraction <= 0:
            continue
        n_held = min(len(indices) - 1, max(1, round(fraction * len(indices))))
        rng = np.random.default_rng([seed, zlib.crc32(user_id.encode()), 2])
        held[rng.choice(indices, size=n_held, replace=False)] = True
    return held
