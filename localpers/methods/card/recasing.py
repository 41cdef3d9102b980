"""A user's casing habit, applied to the finished words of an output: sentence case, Title Case, all lower
case or all capitals.

Moving probability between a word's two spellings while decoding (`TokenBias.case`) carries a casing habit
but drifts the model's choice of words: lower-case word starts are tokens the Title Case adapters rarely
saw after a capitalised first word, and their continuations differ. Casing is a property of the text, not
of the words chosen, so the habit is applied after each word is written instead: the model picks the
words, `Recasing` writes them in the user's case. ROUGE ignores case, so this cannot cost the words.

Fitted from the user's outputs against the cluster model's outputs for the same prompts (the pairs' y-):

- a *lower* habit (sentence case) when at least `HABIT_RATE` of the user's cased later words start in lower
  case and the model's share is at least `MARGIN` below the user's; an *upper* habit (Title Case) the other way.
  The margin is against the model's y- for the user's own conditioned prompts, which drift towards the
  examples' case as the history grows (0.4-0.6 lower case at 20-100 sentence-case examples on the dev split);
  a fixed ceiling on the model's share missed those users. A near-constant habit (`STRONG_HABIT_RATE`) needs
  only `STRONG_MARGIN`: a model that drifts to 0.7 of the user's case still misses it in most outputs;
- `exceptions`: words the user writes mostly in the other case (a sentence-case writer's "Trump", a Title
  Case writer's "of"), kept as the user writes them;
- `names_from_input` (lower habit only): whether the user keeps words that their input text capitalises
  mid-sentence (names). A writer who lower-cases even those gets every later word lower-cased;
- an *all-lower* habit ("zoo opens to new baby giraffe") when at least `STRONG_HABIT_RATE` of the cased
  letters of the user's outputs are lower case, first words and acronyms included, and so are the first
  letters of their first words (a sentence-case writer's many lower-case letters are not enough: their first
  words are capitalised); an *all-upper* habit ("ZOO WELCOMES FIRST BABY GIRAFFE") the same in capitals.
  Both are checked before the habits above, need `MIN_CASED_WORDS` cased words (first words included) and,
  like them, a model that falls short of the user's share by `STRONG_MARGIN`. They change every word, the
  first word and acronyms too ("nfl"), and have no exceptions or names.

Words are whitespace-separated; under the *lower* and *upper* habits the first word of an output,
acronyms ("NFL", two or more letters, all capitals), words with a capital after their first letter
("McDonald's", "iPhone") and the pronoun I ("I'm") are never changed. The first word is the first one with
a letter or a digit: emoji, punctuation or symbols before it ("🔥", "«", "¿") are no word, so "🔥 Zoo opens"
keeps "Zoo" as its first word (and a number is one: "5 things to know" starts with "5"). This module knows
nothing of models or tokens: text in, text out.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

HABIT_RATE = 0.7  # share of the user's cased later words in the habit's case
MARGIN = 0.3  # ... and the model's share of them is at least this much lower
STRONG_HABIT_RATE = 0.95  # a habit this constant ...
STRONG_MARGIN = 0.1  # ... needs the model to fall short of it by this much only
MIN_CASED_WORDS = 20  # cased later words the user's outputs must show before a habit is believed
MIN_NAME_EVIDENCE = 3  # capitalised input words the user repeats, before `names_from_input` is decided
MAX_EXCEPTIONS = 200
ALL_LOWER = "all-lower"  # every word in lower case, the first word and acronyms too
ALL_UPPER = "all-upper"  # every word in capitals
WHOLE_MODES = (ALL_LOWER, ALL_UPPER)
MODES = ("lower", "upper", *WHOLE_MODES)
_WORD = re.compile(r"\S+")
EDGE_PUNCTUATION = "'\"‘’“”„«»‹›()[]{}.,;:!?¿¡…-–—*「」『』"
_SENTENCE_ENDS = (".", "!", "?", ":", ";")


def _core(word: str) -> str:
    return word.strip(EDGE_PUNCTUATION)


def _is_acronym(core: str) -> bool:
    letters = [c for c in core if c.isalpha()]
    return len(letters) >= 2 and all(c.isupper() for c in letters)


_PRONOUN_I = frozenset(f"i{ending}" for ending in ("", "'m", "'ve", "'ll", "'d", "’m", "’ve", "’ll", "’d"))


def _keeps_its_case(core: str) -> bool:
    """Whether a word is written one way whatever the sentence's case: a capital after its first letter (McDonald's,
    YouTube, iPhone, eBay) or the pronoun I and its contractions. Recasing it would change the word itself."""
    for part in re.split(r"[-‐‑/]", core):  # a compound's parts each start a word: Self-Driving is no name
        letters = [c for c in part if c.isalpha()]
        if any(c.isupper() for c in letters[1:]):
            return True
    return core[:1] == "I" and core.lower() in _PRONOUN_I  # a lower-case "i" is Title Case's to mend


def _case_of(word: str) -> str | None:
    """ "upper" or "lower" by the word's first character, None when it has no case to change."""
    core = _core(word)
    if not core or not core[0].isalpha() or _is_acronym(core) or core[0].upper() == core[0].lower():
        return None
    return "upper" if core[0].isupper() else "lower"


def _is_word(token: str) -> bool:
    """Whether a whitespace-separated token is a word (has a letter or a digit), not only emoji or punctuation."""
    return any(c.isalnum() for c in token)


def later_words(text: str) -> list[str]:
    """The words after an output's first word (the first token with a letter or a digit); none without one."""
    tokens = _WORD.findall(text)
    first = next((index for index, token in enumerate(tokens) if _is_word(token)), len(tokens))
    return tokens[first + 1 :]


def input_names(source: str) -> set[str]:
    """Lower-cased words that `source` (prose) capitalises where a sentence does not start: names."""
    names: set[str] = set()
    previous = ""
    for word in _WORD.findall(source):
        if previous and not previous.endswith(_SENTENCE_ENDS) and _case_of(word) == "upper":
            names.add(_core(word).lower())
        previous = word
    return names


@dataclass(frozen=True)
class Recasing:
    """Write later words in lower case (`mode="lower"`) or capitalised (`"upper"`), except the exceptions; or
    every word, the first one included, in lower case (`"all-lower"`) or in capitals (`"all-upper"`)."""

    mode: str
    exceptions: frozenset[str] = field(default_factory=frozenset)
    names_from_input: bool = False

    def word(self, word: str, names: set[str]) -> str:
        """One later word in the user's case (`names`: the input's names, for `names_from_input`); under an
        all-lower or all-upper habit, any word."""
        if self.mode in WHOLE_MODES:
            if _core(word).lower() in self.exceptions:
                return word
            return word.lower() if self.mode == ALL_LOWER else word.upper()
        case = _case_of(word)
        if case is None or case == self.mode:
            return word
        key = _core(word).lower()
        if key in self.exceptions or _keeps_its_case(_core(word)):
            return word
        if self.mode == "upper":
            start = len(word) - len(word.lstrip(EDGE_PUNCTUATION))
            return word[:start] + word[start].upper() + word[start + 1 :]
        if self.names_from_input and key in names:
            return word
        return word.lower()

    def apply(self, text: str, source: str = "") -> str:
        """`text` with every later word in the user's case; spacing, the first word (the first token with a
        letter or a digit) and the emoji or punctuation before it untouched. An all-lower or all-upper habit
        recases every word, the first one included."""
        if self.mode in WHOLE_MODES:
            return _WORD.sub(lambda match: self.word(match.group(0), set()), text)
        names = input_names(source) if self.names_from_input else set()
        started = False

        def recase(match: re.Match[str]) -> str:
            nonlocal started
            if not started:
                started = _is_word(match.group(0))
                return match.group(0)
            return self.word(match.group(0), names)

        return _WORD.sub(recase, text)

    def describe(self) -> str:
        if self.mode == ALL_LOWER:
            return "writes everything in lower case (first words and acronyms too)"
        if self.mode == ALL_UPPER:
            return "writes everything in capitals (all caps)"
        if self.mode == "lower":
            kept = " except names" if self.names_from_input or self.exceptions else ""
            return f"writes later words in lower case (sentence case{kept})"
        return "capitalises later words (Title Case)"

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "exceptions": sorted(self.exceptions),
            "names_from_input": self.names_from_input,
        }

    @classmethod
    def from_json(cls, data: Any) -> Recasing:
        """The inverse of `to_json`; ValueError naming the field on anything malformed."""
        if not isinstance(data, dict) or data.get("mode") not in MODES:
            raise ValueError(f"recasing field 'mode' must be one of {', '.join(MODES)}")
        exceptions = data.get("exceptions", [])
        if not isinstance(exceptions, list) or not all(isinstance(w, str) for w in exceptions):
            raise ValueError("recasing field 'exceptions' must be a list of words")
        if len(exceptions) > MAX_EXCEPTIONS:
            raise ValueError(f"recasing field 'exceptions' holds more than {MAX_EXCEPTIONS} words")
        names = data.get("names_from_input", False)
        if not isinstance(names, bool):
            raise ValueError("recasing field 'names_from_input' must be true or false")
        return cls(data["mode"], frozenset(exceptions), names)


def _lower_share(outputs: Iterable[str]) -> tuple[float, int]:
    cases = [c for text in outputs for c in map(_case_of, later_words(text)) if c is not None]
    return (sum(c == "lower" for c in cases) / len(cases) if cases else 0.0), len(cases)


def _whole_shares(outputs: Iterable[str]) -> tuple[tuple[float, float], int]:
    """How far `outputs` are written wholly in lower case and wholly in capitals, and the number of their
    words with a cased letter (first words and acronyms included).

    Each share is the smaller of the share of all cased letters in that case and the share of the first
    words' first cased letters in it: a sentence-case output is mostly lower-case letters, but not its first
    word.
    """
    letters = lower = firsts = first_lower = words = 0
    for text in outputs:
        first = True
        for token in _WORD.findall(text):
            cased = [c for c in token if c.islower() or c.isupper()]
            if first and _is_word(token):
                first = False
                if cased:
                    firsts += 1
                    first_lower += cased[0].islower()
            if cased:
                words += 1
                letters += len(cased)
                lower += sum(c.islower() for c in cased)
    if not letters:
        return (0.0, 0.0), 0
    letter_share = lower / letters
    first_share = first_lower / firsts if firsts else letter_share
    return (min(letter_share, first_share), min(1.0 - letter_share, 1.0 - first_share)), words


def _habit(user_share: float, model_share: float) -> bool:
    """Whether a user who writes `user_share` of their later words in one case, where the model writes
    `model_share`, has a habit the model does not already keep."""
    if user_share >= STRONG_HABIT_RATE:
        return model_share <= user_share - STRONG_MARGIN
    return user_share >= HABIT_RATE and model_share <= user_share - MARGIN


def fit_recasing(
    outputs: Sequence[str], inputs: Sequence[str], model_outputs: Sequence[str]
) -> Recasing | None:
    """The user's casing habit from their `outputs` (for `inputs`) against the model's, or None.

    None unless the user's cased later words are clearly in one case and the model's clearly less so; an
    all-lower or all-upper habit first, when nearly all the user's letters are in one case, first words too.
    """
    user_whole, user_cased = _whole_shares(outputs)
    model_whole, model_cased = _whole_shares(model_outputs)
    if user_cased >= MIN_CASED_WORDS and model_cased:
        for mode, user_share, model_share in zip(WHOLE_MODES, user_whole, model_whole, strict=True):
            if user_share >= STRONG_HABIT_RATE and _habit(user_share, model_share):
                return Recasing(mode)
    user_lower, user_words = _lower_share(outputs)
    model_lower, model_words = _lower_share(model_outputs)
    if user_words < MIN_CASED_WORDS or not model_words:
        return None
    if _habit(user_lower, model_lower):
        mode = "lower"
    elif _habit(1.0 - user_lower, 1.0 - model_lower):
        mode = "upper"
    else:
        return None
    seen: dict[str, Counter[str]] = {}
    kept_names = name_evidence = 0
    for output, source in zip(outputs, inputs, strict=True):
        names = input_names(source)
        for word in later_words(output):
            case = _case_of(word)
            if case is None:
                continue
            key = _core(word).lower()
            seen.setdefault(key, Counter())[case] += 1
            if key in names:
                name_evidence += 1
                kept_names += case == "upper"
    other = "upper" if mode == "lower" else "lower"
    exceptions = sorted(
        (key for key, counts in seen.items() if counts[other] > counts[mode]),
        key=lambda key: -seen[key][other],
    )[:MAX_EXCEPTIONS]
    names_from_input = (
        mode == "lower" and name_evidence >= MIN_NAME_EVIDENCE and kept_names >= name_evidence / 2
    )
    return Recasing(mode, frozenset(exceptions), names_from_input)


class FinishingStream:
    """Passes streamed text on to `sink` finished word by word (`finish(text, source)`: recased, respelled),
    holding back the word still being written."""

    def __init__(self, finish: Callable[[str, str], str], source: str, sink: Callable[[str], None]) -> None:
        self._finish = finish
        self._source = source
        self._sink = sink
        self._text = ""
        self._sent = 0

    def __call__(self, piece: str) -> None:
        if not piece:  # no text: the sink is asked whether to go on
            self._sink(piece)
            return
        self._text += piece
        end = max(self._text.rfind(" "), self._text.rfind("\n"))
        if end >= 0:
            self._send(self._finish(self._text[: end + 1], self._source))

    def close(self) -> None:
        """Send what is still held back (the last word)."""
        self._send(self._finish(self._text, self._source))

    def _send(self, recased: str) -> None:
        if len(recased) > self._sent:
            self._sink(recased[self._sent :])
            self._sent = len(recased)
