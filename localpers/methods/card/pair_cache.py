"""The fit's caches in a user's folder: the y- it generated and the pair features it scored.

Both are keyed by what makes them valid (the bundle, the adapter y- came from and the fit mark), written
atomically and read and written tolerantly: a missing, damaged or stale cache reads as empty and is rebuilt by the next fit, and
one that cannot be written (a folder or FIFO where it goes) stays as it was; neither is an error. Pruning a
removed item's y- is not a cache write: it must happen, and fails loudly (the JSON file's reading, writing and
pruning are `localpers.methods.keyed_cache`'s). `negatives.json` maps an item (and, for a conditioned prompt, the
prompt's hash) to its y-; `pair_features.safetensors` maps a pair's hash to `g(y+) - g(y-)` and y+'s first-token
log-probability. Neither is exported with the user. This module computes nothing: `pairs.PairBuilder` fills and reads them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence, Set
from pathlib import Path

import numpy as np

from localpers.atomic import write_cache_bytes
from localpers.methods import keyed_cache

NEGATIVES_FILE = "negatives.json"
FEATURES_FILE = "pair_features.safetensors"
# Pairs kept in the features file: a full history's twice over (the choice's refits add pairs of other prompts).
FEATURES_FILE_PAIRS = 1024
# y- kept in the negatives file, likewise (plus those of this fit's prompts, should they be more).
NEGATIVES_FILE_ENTRIES = 1024

PairFeatures = dict[str, tuple[np.ndarray, float]]  # pair hash -> (difference, first log-prob)


def pair_hash(cluster: int, prompt: str, output: str, negative: str) -> str:
    """The features cache's key of one pair."""
    return hashlib.sha256(json.dumps([cluster, prompt, output, negative]).encode("utf-8")).hexdigest()[:24]


def item_of_key(key: str) -> str:
    """The history item a y- cache key belongs to: the item id, or the id before a colon and a prompt hash."""
    return key.split(":", 1)[0]


def read_negatives(user_dir: Path, key: str) -> dict[str, str]:
    """The cached y- (item key -> text) stored under `key`; empty when absent or unreadable."""
    known = keyed_cache.read_entries(user_dir / NEGATIVES_FILE, key)
    return {item: text for item, text in known.items() if isinstance(text, str)}


def write_negatives(user_dir: Path, key: str, known: dict[str, str], used: Sequence[str] = ()) -> bool:
    """Replace the y- cache with `known` under `key` (another bundle's or adapter's are dropped); False when it
    could not be written (`atomic.write_cache_bytes`).

    At most `NEGATIVES_FILE_ENTRIES`: the `used` keys (this fit's prompts) first, then the newest of the rest.
    Each history change gives later items new prompts, so without a cap the file grew with every change.
    """
    chosen = {entry for entry in used if entry in known}
    for entry in reversed(list(known)):  # `known` lists the oldest first: the newest others are kept
        if len(chosen) >= NEGATIVES_FILE_ENTRIES:
            break
        chosen.add(entry)
    kept = {entry: text for entry, text in known.items() if entry in chosen}  # still oldest first
    return keyed_cache.write_entries(user_dir / NEGATIVES_FILE, key, kept)


def forget_negatives(user_dir: Path, kept_item_ids: Set[str]) -> bool:
    """Drop the cached y- of items no longer in the history (a y- is the model's rewrite of the item's input).

    Whether the file changed. Keys are an item id, or an item id and a prompt hash after a colon.
    """
    return keyed_cache.prune_entries(
        user_dir / NEGATIVES_FILE, lambda entry: item_of_key(entry) in kept_item_ids
    )


def read_features(user_dir: Path, key: str, dimension: int) -> PairFeatures:
    """The cached pair features stored under `key` with `dimension`-long differences; empty otherwise."""
    from safetensors import safe_open

    path = user_dir / FEATURES_FILE
    if not path.is_file():
        return {}
    try:
        with safe_open(str(path), framework="numpy") as handle:
            metadata = handle.metadata() or {}
            differences = handle.get_tensor("differences")
            logprobs = handle.get_tensor("first_logprobs")
        hashes = json.loads(metadata.get("pairs", "null"))
    except Exception:  # a damaged cache of any kind is rebuilt, never an error
        return {}
    if (
        metadata.get("key") != key
        or not isinstance(hashes, list)
        or differences.shape != (len(hashes), dimension)
        or logprobs.shape != (len(hashes),)
        # values a fit computes: finite differences, log-probabilities <= 0 (NaN made the fit store a zero vector)
        or not np.all(np.isfinite(differences))
        or not np.all(np.isfinite(logprobs) & (logprobs <= 0.0))
    ):
        return {}
    return {
        str(digest): (differences[row].astype(np.float32), float(logprobs[row]))
        for row, digest in enumerate(hashes)
    }


def write_features(user_dir: Path, key: str, dimension: int, pairs: PairFeatures) -> bool:
    """Store up to `FEATURES_FILE_PAIRS` pairs under `key`, the first ones of `pairs` kept; False when they could
    not be written."""
    from safetensors.numpy import save as save_safetensors

    kept = list(pairs.items())[:FEATURES_FILE_PAIRS]
    tensors = {
        "differences": np.asarray([d for _, (d, _) in kept], dtype=np.float32).reshape(-1, dimension),
        "first_logprobs": np.asarray([p for _, (_, p) in kept], dtype=np.float32),
    }
    metadata = {"key": key, "pairs": json.dumps([digest for digest, _ in kept])}
    return write_cache_bytes(user_dir / FEATURES_FILE, save_safetensors(tensors, metadata=metadata))
