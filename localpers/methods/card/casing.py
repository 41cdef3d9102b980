"""Which tokens start a word in upper or lower case, and each one's other-case twin, read from the vocabulary.

A sentence-case writer ("Fed raises rates") and the Title Case the shared adapters write differ in almost
every word after the first, mostly in words the user's ~20 items never showed, so a bias per token cannot
carry the habit. One share per user can (`TokenBias.case`): the part of the model's probability of a word
start in the case the user avoids that moves to the same word in the other case, " Raises" -> " rais" (the
first token of " raises"), so the model's choice of words stays its own.

A token starts a word when its piece begins with a space and a letter (" Fed"), or with a letter right after
a token ending in a space, quote, bracket, hyphen or slash ("Backed" after "Trump-"). Acronyms (two or more
letters, all capitals) are uncased: no casing habit changes them.

`TokenCasing` answers these questions for token ids, lazily and cached. It reads tokens through two callables
(the engine's detokeniser and tokeniser), so it loads no model and decides nothing itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

CAPITALISED, LOWER, UNCASED = 1, -1, 0
_WORD_BREAKS = " '\"‘’“”(-/"


def word_case(piece: str, previous: str | None = None) -> int:
    """CAPITALISED or LOWER when `piece` starts a word (after the piece `previous`), UNCASED otherwise."""
    if piece.startswith(" "):
        word = piece[1:]
    elif previous is not None and previous and previous[-1] in _WORD_BREAKS:
        word = piece
    else:
        return UNCASED
    if not word or not word[0].isalpha():
        return UNCASED
    letters = [c for c in word if c.isalpha()]
    if len(letters) >= 2 and all(c.isupper() for c in letters):
        return UNCASED
    return CAPITALISED if word[0].isupper() else LOWER


def _flip_first_letter(piece: str) -> str:
    start = 1 if piece.startswith(" ") else 0
    return piece[:start] + piece[start].swapcase() + piece[start + 1 :]


class TokenCasing:
    """Word-start case and other-case twin of token ids, through the engine's `piece` and `tokenize`."""

    def __init__(self, piece: Callable[[int], str], tokenize: Callable[[str], Sequence[int]]) -> None:
        self._piece = piece
        self._tokenize = tokenize
        self._pieces: dict[int, str] = {}
        self._twin: dict[int, int | None] = {}

    def piece(self, token: int) -> str:
        text = self._pieces.get(token)
        if text is None:
            text = self._pieces[token] = self._piece(token)
        return text

    def case_of(self, token: int, previous: int | None = None) -> int:
        """The word-start case of `token` when it follows `previous` (None: at the start of an output)."""
        return word_case(self.piece(token), None if previous is None else self.piece(previous))

    def twin(self, token: int) -> int | None:
        """The first token of the same piece with its first letter in the other case (None if it has none)."""
        if token in self._twin:
            return self._twin[token]
        piece = self.piece(token)
        twin = None
        start = 1 if piece.startswith(" ") else 0
        if len(piece) > start and piece[start].isalpha():
            tokens = self._tokenize(_flip_first_letter(piece))
            twin = int(tokens[0]) if tokens and int(tokens[0]) != token else None
        self._twin[token] = twin
        return twin
