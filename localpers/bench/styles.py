"""Synthetic writing styles for the style probes: a deterministic transform of a headline and a detector.

A probe rewrites every gold headline of a held-out author (history and queries) into one style, lets a
method learn from the transformed history, and asks how often its outputs carry the style. Each style
is one of a different kind, so that a method cannot pass them all with one trick:

- `sentence-case` (casing): only the first word capitalised, acronyms kept ("Fed Raises Rates" ->
  "Fed raises rates");
- `kicker` (a fixed prefix): "Opinion: " in front of every headline;
- `question` (punctuation): every headline ends with a question mark;
- `ampersand` (a lexical habit): "&" wherever the author would write "and".

`detect` answers True/False, or None where the style does not apply to a text (the ampersand habit on a
headline that joins nothing). Both functions are pure and deterministic; `restyle_users` applies a style
to benchmark users' gold outputs (history and queries alike). This module generates nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from localpers.bench.data import BenchUser
from localpers.errors import InputError
from localpers.users.history import HistoryItem

_AND = re.compile(r"\b[Aa]nd\b")
_TRAILING_PUNCTUATION = " .!?;:,"
KICKER = "Opinion: "


@dataclass(frozen=True)
class Style:
    """A named style: `transform` writes a headline in it, `detect` says whether a text carries it."""

    name: str
    kind: str
    description: str
    transform: Callable[[str], str]
    detect: Callable[[str], bool | None]


def _is_acronym(word: str) -> bool:
    letters = [c for c in word if c.isalpha()]
    return len(letters) >= 2 and all(c.isupper() for c in letters)


def sentence_case(text: str) -> str:
    """First word capitalised, later words lower-cased unless they are acronyms (two or more capitals)."""
    words = text.split(" ")
    out = []
    for index, word in enumerate(words):
        if _is_acronym(word):
            out.append(word)
        elif index == 0:
            out.append(word[:1].upper() + word[1:])
        else:
            out.append(word.lower())
    return " ".join(out)


def _detect_sentence_case(text: str) -> bool | None:
    words = [w for w in text.split() if any(c.isalpha() for c in w)]
    if len(words) < 3:
        return None  # too short to tell sentence case from title case
    return sentence_case(text) == text


def add_kicker(text: str) -> str:
    return text if text.startswith(KICKER) else KICKER + text


def end_with_question(text: str) -> str:
    return text.rstrip(_TRAILING_PUNCTUATION) + "?"


def use_ampersand(text: str) -> str:
    return _AND.sub("&", text)


def _detect_ampersand(text: str) -> bool | None:
    uses_and = bool(_AND.search(text))
    if not uses_and and "&" not in text:
        return None  # joins nothing: the habit cannot show
    return not uses_and


STYLES: dict[str, Style] = {
    style.name: style
    for style in (
        Style(
            "sentence-case",
            "casing",
            "only the first word capitalised (acronyms kept)",
            sentence_case,
            _detect_sentence_case,
        ),
        Style(
            "kicker",
            "prefix",
            f"every headline starts with {KICKER.strip()!r}",
            add_kicker,
            lambda text: text.startswith(KICKER),
        ),
        Style(
            "question",
            "punctuation",
            "every headline ends with a question mark",
            end_with_question,
            lambda text: text.rstrip().endswith("?"),
        ),
        Style(
            "ampersand",
            "lexical",
            "'&' wherever the author would write 'and' (scored only where a headline joins something)",
            use_ampersand,
            _detect_ampersand,
        ),
    )
}


def get_style(name: str) -> Style:
    try:
        return STYLES[name]
    except KeyError:
        raise InputError(f"unknown style {name!r}; choose one of: {', '.join(STYLES)}") from None


def restyle_users(users: list[BenchUser], style: Style) -> list[BenchUser]:
    """The same users with every history output and query reference written in `style` (inputs unchanged)."""
    restyled = []
    for user in users:
        history = tuple(
            HistoryItem.create(item.task, item.input, style.transform(item.output), source=item.source)
            for item in user.history
        )
        queries = tuple(replace(query, reference=style.transform(query.reference)) for query in user.queries)
        restyled.append(BenchUser(user.user_id, history, queries))
    return restyled
