"""How a CARD fit names its pairs: the key of an item's y-, whether a pair teaches the head, and the memo of scores.

A y- is stored under the item's id for the item's own plain prompt and under id and prompt hash for a conditioned
or shortened one (`negative_key`); a pair (y+, y-) teaches the head only when y- is non-empty and differs from y+
(`distinct`); `PairMemo` keeps the scored pairs of a session in memory, bounded, so a refit on the same prompts
reuses them. This module scores nothing and reads or writes no file (`pairs`, `pair_batches`, `pair_cache` do).
"""

from __future__ import annotations

import hashlib

import numpy as np

from localpers.tasks import get_task
from localpers.users.history import HistoryItem, item_id

# (cluster, prompt, y+, y-): what a pair's scores depend on, for one bundle and adapter
PairKey = tuple[int, str, str, str]
# `g(y+) - g(y-)` and the base model's log-probability of y+'s first token
PairScores = tuple[np.ndarray, float]


def distinct(item: HistoryItem, negative: str) -> bool:
    """Whether the pair (y+ = the item's output, y- = `negative`) is one the head learns from."""
    return bool(negative) and negative != item.output


def negative_key(item: HistoryItem, prompt: str) -> str:
    """The item id for its own plain prompt (as before conditioned bundles); id and prompt hash otherwise, also for
    an item the fit cut to the context: how far depends on the other items, so its prompt can change."""
    own = item_id(item.task, item.input, item.output) == item.id  # not cut: its input is the stored one
    if own and prompt == get_task(item.task).prompt_for(item.input):
        return item.id
    return f"{item.id}:{hashlib.sha256(prompt.encode('utf-8')).hexdigest()[:12]}"


class PairMemo:
    """Scored pairs by `PairKey`, at most `size` of them; the oldest goes first when full."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._scores: dict[PairKey, PairScores] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._scores

    def __getitem__(self, key: PairKey) -> PairScores:
        return self._scores[key]

    def __len__(self) -> int:
        return len(self._scores)

    def remember(self, key: PairKey, scores: PairScores) -> None:
        if key not in self._scores and len(self._scores) >= self.size:
            self._scores.pop(next(iter(self._scores)))
        self._scores[key] = scores

    def clear(self) -> None:
        self._scores.clear()
