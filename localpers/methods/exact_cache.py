"""EXACT's selection cache: the attribute set greedy search chose for each pair, kept so no pair is searched twice.

Searching one pair costs 1 + 42 + 41 + 40 prompt scorings (~30 s on 2 cores even side by side, `scoring_batch`:
every scoring needs the vocabulary's log-probabilities for each token of y+ and y-; docs/PERFORMANCE.md). What can
be saved is doing it again: `exact-selections.json` in the user's folder maps each searched item to what the search
found and a digest of what it scored (the prompts, y+ and y-), under a key naming the rest the search depends on
(the bundle, the adapter, k, the attribute library, the fit mark and the way its candidates were scored, `search`).
A refit searches only the items it has no record for, or whose scored texts changed (another y-, another prompt
wording); a fit stopped by Ctrl-C finds the pairs it had searched (the cache is written after each one). Read and
written tolerantly: a missing, damaged or stale file reads as empty, and one that cannot be written stays as it was.
Like the y- cache, it is not exported with the user, and `localpers.methods.forget` drops the records of removed
items.
This module runs no model and decides nothing about which pairs to search (`localpers.methods.exact` does).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence, Set
from dataclasses import asdict, dataclass
from pathlib import Path

from localpers.methods import keyed_cache

SELECTIONS_FILE = "exact-selections.json"


@dataclass(frozen=True)
class SelectionRecord:
    """What greedy search found for one pair, and the digest of what it scored (`scored_digest`)."""

    scored: str
    attributes: tuple[str, ...]
    margin: float
    base_margin: float


def scored_digest(texts: Sequence[str]) -> str:
    """A short digest of the texts a search scored: a record is reused only for the same ones."""
    return hashlib.sha256(json.dumps(list(texts), ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


def selections_key(
    bundle_sha256: str, adapter: str, k: int, library: Sequence[str], fit_mark: str, search: str | None = None
) -> str:
    """The cache key: a record found under another bundle, adapter, k, library, fit format or way of scoring the
    search (`search`, the index's meta; None for the one-at-a-time scoring of indexes that do not name theirs) is
    not reused: llama.cpp's numbers move with how the tokens are batched, so the two ways pick differently."""
    identity = json.dumps([bundle_sha256, adapter, k, list(library), fit_mark, *([search] if search else [])])
    return hashlib.sha256(identity.encode("utf-8")).hexdigest()[:24]


def _record(value: object, library: Set[str], k: int) -> SelectionRecord | None:
    """A stored record, or None for one that does not hold what a search of this key could have found."""
    if not isinstance(value, dict):
        return None
    scored, attributes = value.get("scored"), value.get("attributes")
    margin, base_margin = _finite(value.get("margin")), _finite(value.get("base_margin"))
    if (
        not (isinstance(scored, str) and isinstance(attributes, list))
        or margin is None
        or base_margin is None
    ):
        return None
    if not 1 <= len(attributes) <= k or not all(isinstance(a, str) and a in library for a in attributes):
        return None
    if len(set(attributes)) != len(attributes):
        return None
    return SelectionRecord(scored, tuple(attributes), margin, base_margin)


def _finite(number: object) -> float | None:
    """A stored number as a finite float; None for anything else (text, a boolean, NaN, an integer too large)."""
    if not isinstance(number, (int, float)) or isinstance(number, bool):
        return None
    try:
        value = float(number)
    except OverflowError:  # an integer of hundreds of digits, which JSON allows
        return None
    return value if math.isfinite(value) else None


def read_selections(user_dir: Path, key: str, library: Sequence[str], k: int) -> dict[str, SelectionRecord]:
    """The records stored under `key` (item id -> record); empty when the file is absent, damaged or stale."""
    names = set(library)
    records = {
        item: _record(value, names, k)
        for item, value in keyed_cache.read_entries(user_dir / SELECTIONS_FILE, key).items()
    }
    return {item: record for item, record in records.items() if record is not None}


def write_selections(user_dir: Path, key: str, records: Mapping[str, SelectionRecord]) -> bool:
    """Replace the cache with `records` under `key` (records under any other key are dropped); False when it
    cannot be written."""
    entries = {item: asdict(record) for item, record in records.items()}
    return keyed_cache.write_entries(user_dir / SELECTIONS_FILE, key, entries)


def forget_selections(user_dir: Path, kept_item_ids: Set[str]) -> bool:
    """Drop the records of items no longer in the history; whether the file changed."""
    return keyed_cache.prune_entries(user_dir / SELECTIONS_FILE, lambda item: item in kept_item_ids)
