"""EXACT's selection cache: the attribute set greedy search chose for each pair, kept so no pair is searched twice.

Searching one pair costs 1 + 42 + 41 + 40 prompt scorings (~30 s on 2 cores), and every scoring needs the
vocabulary's log-probabilities for each token of y+ and y-, so batching prompts side by side saves nothing
(docs/PERFORMANCE.md). What can be saved is doing it again: `exact-selections.json` in the user's folder maps each
searched item to its y-'s digest and what the search found, under a key naming everything the search depends on
(the bundle, the adapter, k, the attribute library and the fit format). A refit searches only the items it has no
record for, or whose y- changed; a fit stopped by Ctrl-C finds the pairs it had searched (the cache is written
after each one). Read tolerantly: a missing, damaged or stale file reads as empty. Like the y- cache, it is not
exported with the user, and `localpers.methods.forget` drops the records of removed items. This module runs no
model and decides nothing about which pairs to search (`localpers.methods.exact` does).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from pathlib import Path

from localpers.atomic import atomic_write_text
from localpers.errors import LocalpersError
from localpers.regular_files import STATE_FILE_LIMIT, read_regular_file
from localpers.untrusted import JSONProblem, parse_json

SELECTIONS_FILE = "exact-selections.json"


@dataclass(frozen=True)
class SelectionRecord:
    """What greedy search found for one pair, and the digest of the y- it was searched against."""

    negative: str
    attributes: tuple[str, ...]
    margin: float
    base_margin: float

    def to_json(self) -> dict[str, object]:
        return {
            "negative": self.negative,
            "attributes": list(self.attributes),
            "margin": self.margin,
            "base_margin": self.base_margin,
        }


def negative_digest(negative: str) -> str:
    """A short digest of a y- text: a record is reused only for the same y-."""
    return hashlib.sha256(negative.encode("utf-8")).hexdigest()[:16]


def selections_key(bundle_sha256: str, adapter: str, k: int, library: Sequence[str], fit_mark: str) -> str:
    """The cache key: a record found under another bundle, adapter, k, library or fit format is not reused."""
    identity = json.dumps([bundle_sha256, adapter, k, list(library), fit_mark])
    return hashlib.sha256(identity.encode("utf-8")).hexdigest()[:24]


def _record(value: object, library: Set[str], k: int) -> SelectionRecord | None:
    """A stored record, or None for one that does not hold what a search of this key could have found."""
    if not isinstance(value, dict):
        return None
    negative, attributes = value.get("negative"), value.get("attributes")
    margin, base_margin = value.get("margin"), value.get("base_margin")
    numbers_ok = all(
        isinstance(number, (int, float)) and not isinstance(number, bool) and math.isfinite(number)
        for number in (margin, base_margin)
    )
    if not (isinstance(negative, str) and isinstance(attributes, list) and numbers_ok):
        return None
    if not 1 <= len(attributes) <= k or not all(isinstance(a, str) and a in library for a in attributes):
        return None
    if len(set(attributes)) != len(attributes):
        return None
    return SelectionRecord(negative, tuple(attributes), float(margin), float(base_margin))  # type: ignore[arg-type]


def read_selections(user_dir: Path, key: str, library: Sequence[str], k: int) -> dict[str, SelectionRecord]:
    """The records stored under `key` (item id -> record); empty when the file is absent, damaged or stale."""
    try:
        cache = parse_json(
            read_regular_file(user_dir / SELECTIONS_FILE, STATE_FILE_LIMIT, what="cache", stored=True)
        )
    except (LocalpersError, JSONProblem):
        return {}
    stored = cache.get(key) if isinstance(cache, dict) else None
    if not isinstance(stored, dict):
        return {}
    names = set(library)
    records = {item: _record(value, names, k) for item, value in stored.items()}
    return {item: record for item, record in records.items() if record is not None}


def write_selections(user_dir: Path, key: str, records: Mapping[str, SelectionRecord]) -> None:
    """Replace the cache with `records` under `key` (records under any other key are dropped)."""
    payload = {key: {item: record.to_json() for item, record in records.items()}}
    atomic_write_text(user_dir / SELECTIONS_FILE, json.dumps(payload, ensure_ascii=False))


def forget_selections(user_dir: Path, kept_item_ids: Set[str]) -> bool:
    """Drop the records of items no longer in the history; whether the file changed."""
    path = user_dir / SELECTIONS_FILE
    try:
        cache = parse_json(read_regular_file(path, STATE_FILE_LIMIT, what="cache", stored=True))
    except (LocalpersError, JSONProblem):
        return False
    if not isinstance(cache, dict):
        return False
    pruned = {
        key: {item: value for item, value in stored.items() if item in kept_item_ids}
        for key, stored in cache.items()
        if isinstance(stored, dict)
    }
    if pruned == cache:
        return False
    atomic_write_text(path, json.dumps(pruned, ensure_ascii=False))
    return True
