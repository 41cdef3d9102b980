"""The JSON caches a fit keeps in a user's folder, shaped `{key: {entry: value}}`: read, written and pruned alike.

The key names what makes the entries valid (a bundle and an adapter, say); entries are keyed by a history item's id
(or one followed by more). Reads are tolerant: a missing, damaged, oversized or non-regular file, or one holding
another key, reads as no entries. Writes keep one key and are never an error (`atomic.write_cache_bytes`: a file
that cannot be written stays as it was). Pruning the entries of removed items is not a cache write: it must happen,
and fails loudly. What an entry's value means, and whether it is sound, is the caller's (`card.pair_cache`,
`exact_cache`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

from localpers.atomic import atomic_write_text, write_cache_bytes
from localpers.errors import LocalpersError
from localpers.regular_files import STATE_FILE_LIMIT, read_regular_file
from localpers.untrusted import JSONProblem, parse_json


def _read_cache(path: Path) -> dict[str, object] | None:
    """The whole cache, or None when absent or unreadable (a FIFO, device or oversized file is never read)."""
    try:
        cache = parse_json(read_regular_file(path, STATE_FILE_LIMIT, what="cache", stored=True))
    except (LocalpersError, JSONProblem):
        return None
    return cache if isinstance(cache, dict) else None


def read_entries(path: Path, key: str) -> dict[str, object]:
    """The entries stored under `key`; empty when the file is absent, damaged or holds another key."""
    entries = (_read_cache(path) or {}).get(key)
    return dict(entries) if isinstance(entries, dict) else {}


def write_entries(path: Path, key: str, entries: Mapping[str, object]) -> bool:
    """Replace the cache with `entries` under `key` (any other key is dropped); False when it cannot be written."""
    return write_cache_bytes(path, json.dumps({key: dict(entries)}, ensure_ascii=False).encode("utf-8"))


def prune_entries(path: Path, keeps: Callable[[str], bool]) -> bool:
    """Drop, under every key, the entries `keeps` refuses (those of removed items); whether the file changed."""
    cache = _read_cache(path)
    if cache is None:
        return False
    pruned = {
        key: {entry: value for entry, value in entries.items() if keeps(entry)}
        for key, entries in cache.items()
        if isinstance(entries, dict)
    }
    if pruned == cache:
        return False
    atomic_write_text(path, json.dumps(pruned, ensure_ascii=False))
    return True
