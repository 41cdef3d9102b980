"""A user's spelling of words that house styles write more than one way ("and" or "&"), applied to finished text.

Some habits are a choice between interchangeable spellings of one word: "&" for "and", "vs" for "versus".
A token bias cannot carry them from a short history: a user with 20 headlines has written "and" in two or
three of them, which gives a counted "&" a push of about log 3 against a model that ranks it far below "And"
(the dev-split ampersand probe: 5% of outputs, docs/RESULTS.md 0r). Like casing (`recasing`), the spelling
is a property of the text, not of the words the model chooses, so it is applied after the words are written:
the model picks "And", `Respelling` writes it the way the user does.

Fitted from the user's outputs against the cluster model's outputs for the same prompts (the pairs' y-): for
each family of `FAMILIES`, a habit when the user wrote the family at least `MIN_USES` times, at least
`HABIT_RATE` of them in one form, and the model's own most frequent form (the family's first, common one if
it wrote none) is another. One use is enough: 20 headlines hold the family about twice, and a wrong "&" for
"and" costs little, while two uses found the habit in only 71% of the dev split's probe outputs. Only the
families listed are known; a spelling outside them is the token bias's business. Words are
whitespace-separated and compared without their edge punctuation, which is kept from the replaced word (so
"Versus," becomes "vs," whether or not the user writes "vs."). This module knows nothing
of models or tokens: text in, text out.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from localpers.methods.card.recasing import EDGE_PUNCTUATION

# Each family: the forms (lower case, edge punctuation stripped) one word is written in.
FAMILIES: dict[str, tuple[str, ...]] = {
    "and": ("and", "&"),
    "versus": ("versus", "vs"),
}
# Times the user's outputs show the family before a habit is believed (chosen on the dev split, RESULTS 0r).
MIN_USES = 1
HABIT_RATE = 0.7  # share of those uses in the habit's form
_WORD = re.compile(r"\S+")
_FAMILY_OF = {form: family for family, forms in FAMILIES.items() for form in forms}


def _split(word: str) -> tuple[str, str, str]:
    """(leading punctuation, core, trailing punctuation) of a whitespace-separated word."""
    core = word.strip(EDGE_PUNCTUATION)
    if not core:
        return word, "", ""
    start = word.index(core)
    return word[:start], core, word[start + len(core) :]


def _family_words(texts: Iterable[str]) -> dict[str, Counter[str]]:
    """Per family, how often each spelling (as written) occurs in `texts`."""
    seen: dict[str, Counter[str]] = {}
    for text in texts:
        for word in _WORD.findall(text):
            core = _split(word)[1]
            family = _FAMILY_OF.get(core.lower())
            if family is not None:
                seen.setdefault(family, Counter())[core] += 1
    return seen


def _preferred(counts: Counter[str]) -> tuple[str, int, int]:
    """(the most used form, lower case; its count; all uses), forms compared without case."""
    by_form: Counter[str] = Counter()
    for spelling, count in counts.items():
        by_form[spelling.lower()] += count
    form, count = max(by_form.items(), key=lambda pair: (pair[1], pair[0]))
    return form, count, sum(by_form.values())


@dataclass(frozen=True)
class Respelling:
    """Write each family's words in the user's spelling: family -> that spelling as the user writes it."""

    spellings: dict[str, str]

    def word(self, word: str) -> str:
        lead, core, trail = _split(word)
        family = _FAMILY_OF.get(core.lower())
        if family is None or family not in self.spellings:
            return word
        spelling = self.spellings[family]
        if core.lower() == spelling.lower():
            return word  # already the user's form (its case is recasing's business)
        return lead + spelling + trail

    def apply(self, text: str) -> str:
        """`text` with every word of a known family in the user's spelling; spacing untouched."""
        return _WORD.sub(lambda match: self.word(match.group(0)), text)

    def describe(self) -> str:
        return ", ".join(
            f"writes {spelling!r} for {', '.join(repr(f) for f in FAMILIES[family] if f != spelling.lower())}"
            for family, spelling in sorted(self.spellings.items())
        )

    def to_json(self) -> dict[str, str]:
        return dict(sorted(self.spellings.items()))

    @classmethod
    def from_json(cls, data: Any) -> Respelling:
        """The inverse of `to_json`; ValueError naming the field on anything malformed."""
        if not isinstance(data, dict) or not data:
            raise ValueError("respelling must be an object of family -> spelling")
        for family, spelling in data.items():
            if family not in FAMILIES:
                raise ValueError(f"respelling family {family!r} is unknown; known: {', '.join(FAMILIES)}")
            if not isinstance(spelling, str) or spelling.lower() not in FAMILIES[family]:
                raise ValueError(f"respelling of {family!r} must be one of {', '.join(FAMILIES[family])}")
        return cls(dict(data))


def fit_respelling(outputs: Sequence[str], model_outputs: Sequence[str]) -> Respelling | None:
    """The user's spelling habits from their `outputs` against the model's for the same prompts, or None."""
    user = _family_words(outputs)
    model = _family_words(model_outputs)
    spellings: dict[str, str] = {}
    for family, counts in user.items():
        form, count, uses = _preferred(counts)
        if uses < MIN_USES or count < HABIT_RATE * uses:
            continue
        # A model that did not write the family at all is taken to use its first, common form.
        model_form = _preferred(model[family])[0] if family in model else FAMILIES[family][0]
        if model_form == form:
            continue  # the model already writes it so
        spellings[family] = max(
            (s for s in counts if s.lower() == form), key=lambda s: (counts[s], s)
        )  # as the user writes it most often ("And", "&")
    return Respelling(spellings) if spellings else None
