"""Recurring formulas in a user's history: outputs the user writes again and again with small changes.

A *series* around one earlier output is every output of the history whose word overlap with it (the F1 of
their sets of lowercased words) reaches `SIMILARITY`: a weekly roundup ("N Of The Funniest Tweets About
Cats And Dogs This Week (dates)"), an awards night's "The Complete Winners List". When one of the outputs
most similar to a new text belongs to a series of at least `MIN_SIZE`, the prompt shows that series' most
recent members, so the model sees the formula repeated instead of once: on the train authors' dev split the
conditioned adapter then follows a formula it ignored when shown one instance (docs/RESULTS.md, 0zn).

    find_series(["Top 5 Films (May)", "Top 5 Films (June)", "Rain Due", "Top 5 Films (July)"], [1, 2]) -> [0, 1, 3]

This module only finds positions; which of them a prompt shows is `history_prompt`'s decision. It loads no
model and reads no file.
"""

from __future__ import annotations

from collections.abc import Sequence

from localpers.users.retrieval import words

# Word-set F1 at or above which two outputs belong to one series: the "formula sibling" threshold of
# docs/RESULTS.md 0zm, not swept.
SIMILARITY = 0.5
# The fewest outputs (the one found included) that make a series. On the dev split 2 gained as much, within
# noise, while changing four times as many outputs (0zn).
MIN_SIZE = 3
# How many of the series' most recent members a prompt shows, and how many of the outputs closest to the new
# text are looked at for a series (both chosen on the dev split, 0zn).
SHOWN = 3
SEARCH_DEPTH = 10


def word_set(text: str) -> frozenset[str]:
    """The lowercased words of `text` as a set: word_set("Top 5 top") -> {"top", "5"}."""
    return frozenset(words(text))


def overlap(first: frozenset[str], second: frozenset[str]) -> float:
    """F1 of two word sets (0.0 when either is empty)."""
    if not first or not second:
        return 0.0
    shared = len(first & second)
    return 2 * shared / (len(first) + len(second))


def find_series(
    outputs: Sequence[str],
    closest: Sequence[int],
    *,
    min_size: int = MIN_SIZE,
    similarity: float = SIMILARITY,
    word_sets: Sequence[frozenset[str]] | None = None,
) -> list[int]:
    """Positions (in history order) of the first series among `closest` (positions in `outputs`, best first).

    The series around an output holds every output within `similarity` of it, itself included; the first of
    `closest` whose series has `min_size` members or more wins. [] when none does. `word_sets` may carry
    `word_set` of every output, computed once for many calls.
    """
    sets = word_sets if word_sets is not None else [word_set(output) for output in outputs]
    for position in closest:
        around = sets[position]
        members = [i for i, other in enumerate(sets) if overlap(around, other) >= similarity]
        if len(members) >= min_size:
            return members
    return []
