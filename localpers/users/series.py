"""Recurring formulas in a user's history: outputs the user writes again and again with small changes.

A *series* around one earlier output is every output of the history whose word overlap with it (the F1 of
their sets of lowercased words) reaches `SIMILARITY`: a weekly roundup ("N Of The Funniest Tweets About
Cats And Dogs This Week (dates)"), an awards night's "The Complete Winners List". When one of the outputs
most similar to a new text belongs to a series of at least `MIN_SIZE`, the prompt shows that series' most
recent members, so the model sees the formula repeated instead of once: on the train authors' dev split the
conditioned adapter then follows a formula it ignored when shown one instance (docs/RESULTS.md, 0zn). A series
is shown only for a text about its subject (`about_series`: the text shares a word other than a function word
with one of its items) or when it holds half the history or more: BM25 finds a series "close" to any text that
shares a mere "the" with it, and a small history with a large series then got the formula for every text (0zo).

    find_series(["Top 5 Films (May)", "Top 5 Films (June)", "Rain Due", "Top 5 Films (July)"], [1, 2]) -> [0, 1, 3]

This module only finds positions; which of them a prompt shows is `history_prompt`'s decision. It loads no
model and reads no file.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

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
# Function words: a text that shares only these with a series' items is not about the series' subject. English
# first; then the commonest of German, French, Spanish, Italian, Portuguese and Dutch, without which any German
# text shared "die" or "und" with a German series and was given its formula (single letters never count).
_FUNCTION_WORDS = """
    a about after again against all also am an and any are as at be because been before being between
    both but by can could did do does doing down during each either every few for from further had has
    have having he her here hers herself him himself his how i if in into is it its itself just let me
    more most much my myself no nor not now of off on once one only or other our ours out over own same
    she should so some such than that the their theirs them themselves then there these they this those
    through to too under until up upon us very was we were what when where which while who whom whose
    why will with would yet you your yours
    der die das den dem des ein eine einen einem einer und ist im mit von zu zum zur auf für fur nicht sich auch
    es nach bei aus um wie wird werden sind war hat wir ihr sie er ich noch nur oder aber als bis
    le la les du de un une et est en au aux pour par sur dans que qui ne pas plus ce cette ces son sa ses il
    elle ils nous vous avec sans
    el los las del al lo su sus por para con como más mas se es una uno y
    il lo gli di da tra fra che non della dei delle nel nella alla con
    os da dos das em no na um uma ao não nao
    het een van op te dat voor zijn aan niet met"""
FUNCTION_WORDS = frozenset(_FUNCTION_WORDS.split())


def subject_words(text: str) -> frozenset[str]:
    """`text`'s lowercased words less function words and single characters, a plural's final s dropped.

    subject_words("The Dogs of the city") -> {"dog", "city"}
    """
    return frozenset(_singular(word) for word in words(text) if len(word) > 1 and word not in FUNCTION_WORDS)


def _singular(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def about_series(text: str, member_documents: Sequence[str], history_size: int) -> bool:
    """Whether a series whose items read `member_documents` (input and output) applies to `text`.

    It does when `text` shares a subject word with one of them, or when the series is at least half of a
    history of `history_size` items (an author who mostly writes the series: on the dev split such an
    author's every new text was an instance, with no word in common but "the").
    """
    if 2 * len(member_documents) >= history_size:
        return True
    wanted = subject_words(text)
    return any(wanted & subject_words(document) for document in member_documents)


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


def distinct_series(
    outputs: Sequence[str], *, min_size: int = MIN_SIZE, similarity: float = SIMILARITY
) -> list[list[int]]:
    """Every series the history holds, once each: positions in `outputs`, the most recently continued first.

    Each is the series around its latest member not already counted in a later one (`find_series`), so an
    output can appear in two series only when it is alike to both formulas.
    """
    sets = [word_set(output) for output in outputs]
    alike = _alike_finder(sets, similarity)
    counted: set[int] = set()
    found: list[list[int]] = []
    for position in reversed(range(len(outputs))):
        if position in counted:
            continue
        members = alike(position)
        if len(members) >= min_size:
            found.append(members)
            counted.update(members)
    return found


def _alike_finder(sets: Sequence[frozenset[str]], similarity: float) -> Callable[[int], list[int]]:
    """A function from a position to the positions whose word set is within `similarity` of its own, in order:
    what `find_series` computes by comparing with every output, found from an index of the words instead.

    Two sets of sizes a and b with F1 >= t share s >= t * a / (2 - t) words, so a set alike to A holds one of
    any a - s + 1 words of A (A's rarest, to look at the fewest); only those words' outputs are compared. The
    profile lists a history's series after every accept: 500 items took ~80 ms, now ~11 ms, with the same
    result (a test compares the two on random histories; docs/PERFORMANCE.md, seventy-fifth session).
    """
    if similarity <= 0:  # everything is alike to everything
        return lambda position: [
            i for i, other in enumerate(sets) if overlap(sets[position], other) >= similarity
        ]
    frequency = Counter(word for output_words in sets for word in output_words)
    outputs_with: dict[str, list[int]] = {}
    for i, output_words in enumerate(sets):
        for word in output_words:
            outputs_with.setdefault(word, []).append(i)

    def alike(position: int) -> list[int]:
        around = sets[position]
        shared = max(1, math.ceil(similarity * len(around) / (2 - similarity) - 1e-9))  # the fewest in common
        rarest = sorted(around, key=lambda word: (frequency[word], word))[: len(around) - shared + 1]
        candidates = {i for word in rarest for i in outputs_with[word]}
        return sorted(i for i in candidates if overlap(around, sets[i]) >= similarity)

    return alike


@dataclass(frozen=True)
class HistorySeries:
    """One series in a user's history: its task, its members' item ids (history order) and its latest output."""

    task: str
    ids: tuple[str, ...]
    latest: str

    @property
    def size(self) -> int:
        return len(self.ids)

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "size": self.size, "latest": self.latest, "ids": list(self.ids)}


def history_series(items: Sequence[Any]) -> list[HistorySeries]:
    """`distinct_series` of each task's outputs in `items` (HistoryItem-like: id, task, output), by task."""
    found = []
    for task in sorted({item.task for item in items}):
        of_task = [item for item in items if item.task == task]
        for members in distinct_series([item.output for item in of_task]):
            found.append(
                HistorySeries(task, tuple(of_task[i].id for i in members), of_task[members[-1]].output)
            )
    return found
