"""Each history item's ordinal: its place in the order the user's items were added, kept across removals.

A CARD fit prompts items in groups counted along the history (`localpers.methods.card.fit_prompts`), and caches
each prompt's y- and pair features. Counted by position, removing the oldest item moved every later item into
another group, so no prompt matched its cache and a 500-item fit started over (6 minutes instead of 20 s).
Counted by ordinal, a removal leaves the other items' groups as they were; appended items take the next ordinals.

`history_ordinals.json` maps the current items' ids to their ordinals. It is a cache in the weak sense: missing
or damaged, it reads as empty, the fit counts by position (what it did before the file existed), and the next
history change writes it again from the stored history's positions. This module reads and writes that file only.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from localpers.atomic import atomic_write_text
from localpers.errors import LocalpersError
from localpers.regular_files import STATE_FILE_LIMIT, read_regular_file
from localpers.untrusted import JSONProblem, parse_json
from localpers.users.history import HistoryItem

ORDINALS_FILE = "history_ordinals.json"


def read_ordinals(user_dir: Path) -> dict[str, int]:
    """Item id -> ordinal as stored; empty when the file is absent or not such a mapping."""
    try:
        stored = parse_json(
            read_regular_file(user_dir / ORDINALS_FILE, STATE_FILE_LIMIT, what="cache", stored=True)
        )
    except (LocalpersError, JSONProblem):
        return {}
    ordinals = stored.get("ordinals") if isinstance(stored, dict) else None
    if not isinstance(ordinals, dict):
        return {}
    return {
        item: value
        for item, value in ordinals.items()
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0
    }


def updated_ordinals(
    user_dir: Path, stored_history: Callable[[], list[HistoryItem]], items: Sequence[HistoryItem]
) -> dict[str, int]:
    """The ordinals of `items`, the history about to be stored: kept items keep theirs, new ones come after.

    Without a stored mapping, the stored history's positions are the ordinals (what the fit counted before).
    An item whose ordinal would not follow the one before it (a history reordered by hand) gets a new one.
    """
    known = read_ordinals(user_dir) or {item.id: n for n, item in enumerate(stored_history())}
    next_free = max(known.values(), default=-1) + 1
    ordinals: dict[str, int] = {}
    last = -1
    for item in items:
        ordinal = known.get(item.id)
        if ordinal is None or ordinal <= last or item.id in ordinals:
            ordinal, next_free = next_free, next_free + 1
        ordinals[item.id] = last = ordinal
        next_free = max(next_free, ordinal + 1)
    return ordinals


def write_ordinals(user_dir: Path, ordinals: dict[str, int]) -> None:
    """Store the mapping; one that cannot be written (a folder in its place) is left, as a cache: the fit then
    counts by position, as before ordinals."""
    with contextlib.suppress(LocalpersError):
        atomic_write_text(user_dir / ORDINALS_FILE, json.dumps({"version": 1, "ordinals": ordinals}))


def ordinals_of(user_dir: Path, items: Sequence[HistoryItem]) -> list[int] | None:
    """The stored ordinals of `items` in order, or None unless every item has one and they increase."""
    known = read_ordinals(user_dir)
    found = [known.get(item.id) for item in items]
    if any(ordinal is None for ordinal in found):
        return None
    ordinals = [int(ordinal) for ordinal in found if ordinal is not None]
    if any(later <= earlier for earlier, later in zip(ordinals, ordinals[1:], strict=False)):
        return None
    return ordinals
