"""The dev split: a train author's items cut as the test file was made, to choose settings on train authors.

Train authors' lines hold only a history. `split_for_dev` takes the author's items oldest first (by their ISO
dates, stably), each item once, and makes the most recent 30% of them (at least 5, at most 40) the queries and
up to 100 items before them the history (`DevSplit.history`); an author too short for 5 queries and one
history item gets no queries. The constants are the test file's protocol
(`../shared/data/news-headlines/README.md`).

What it does not do: read or check a file or its items (`localpers.bench.data` reads them, with `--dev-split`
through `split_for_dev`, and refuses what is not an item), or score anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localpers.users.dates import oldest_first

# The test file's protocol (../shared/data/news-headlines/README.md), applied to train authors by `dev_split`.
DEV_QUERY_FRACTION, DEV_MIN_QUERIES, DEV_MAX_QUERIES, DEV_MAX_HISTORY = 0.3, 5, 40, 100


def dev_query_count(n_items: int) -> int:
    """How many of an author's `n_items` the dev split takes as queries (0 when the author is too short)."""
    count = min(DEV_MAX_QUERIES, max(DEV_MIN_QUERIES, round(DEV_QUERY_FRACTION * n_items)))
    return count if n_items >= count + 1 else 0


@dataclass(frozen=True)
class DevSplit:
    """One train author's items as `--dev-split` reads them: oldest first, each item once, cut before the most
    recent ones, the queries (none for an author too short to split)."""

    earlier: list[Any]  # every item before the queries
    queries: list[Any]
    resorted: bool  # the items were not oldest first
    repeats: int  # items listed twice, left out

    @property
    def history(self) -> list[Any]:
        """What the bench fits on: the last DEV_MAX_HISTORY items before the queries (none without queries)."""
        return self.earlier[-DEV_MAX_HISTORY:] if self.queries else []


def split_for_dev(records: list[Any]) -> DevSplit:
    """The dev split of one author's items (history and any queries, in file order), as the test file was made.

    The one place the split is made: `scripts/heldout_corpus.py` trains on `earlier`, so that no dev query is
    trained on."""
    merged, resorted = oldest_first(records)
    # an item listed twice: moved into the queries, the second copy stopped the whole run ("duplicate id")
    merged, repeats = _first_of_each(merged)
    cut = len(merged) - dev_query_count(len(merged))
    return DevSplit(merged[:cut], merged[cut:], resorted, repeats)


def _first_of_each(records: list[Any]) -> tuple[list[Any], int]:
    """`records` without the repeats of an item (the same id, input and output; another article under a reused id
    is not a repeat), and how many were left out. What is not an item object is kept, for `_fields` to refuse by
    its place."""
    seen: set[tuple[str, ...]] = set()
    kept = []
    for entry in records:
        if isinstance(entry, dict):
            key = (str(entry.get("id") or ""), str(entry.get("input")), str(entry.get("output")))
            if key in seen:
                continue
            seen.add(key)
        kept.append(entry)
    return kept, len(records) - len(kept)
