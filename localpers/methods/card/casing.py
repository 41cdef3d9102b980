"""Which tokens start a word in upper or lower case, and each one's other-case twin, read from the vocabulary.

A sentence-case writer ("Fed raises rates") and the Title Case the shared adapters write differ in almost
every word after the first, mostly in words the user's ~20 items never showed, so a bias per token cannot
carry the habit. One bias on the class of capitalised word starts can (`TokenBias.case`), provided each
candidate's other-case twin can join the candidates: " Raises" -> " rais" (the first token of " raises").

`TokenCasing` answers both questions for a token id, lazily and cached. It reads tokens through two
callables (the engine's detokeniser and tokeniser), so it loads no model and decides nothing itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

CAPITALISED, LOWER, UNCASED = 1, -1, 0


def word_case(piece: str) -> int:
    """CAPITALISED or LOWER for a token that starts a word (" Fed", " fed"), UNCASED for anything else.

    Acronyms (" FBI", two or more letters, all capitals) and word pieces without a leading space are uncased:
    no casing habit should change them.
    """
    if not piece.startswith(" ") or len(piece) < 2 or not piece[1].isalpha():
        return UNCASED
    letters = [c for c in piece[1:] if c.isalpha()]
    if len(letters) >= 2 and all(c.isupper() for c in letters):
        return UNCASED
    return CAPITALISED if piece[1].isupper() else LOWER


class TokenCasing:
    """Word-start case and other-case twin of token ids, through the engine's `piece` and `tokenize`."""

    def __init__(self, piece: Callable[[int], str], tokenize: Callable[[str], Sequence[int]]) -> None:
        self._piece = piece
        self._tokenize = tokenize
        self._case: dict[int, int] = {}
        self._twin: dict[int, int | None] = {}

    def case_of(self, token: int) -> int:
        case = self._case.get(token)
        if case is None:
            case = self._case[token] = word_case(self._piece(token))
        return case

    def twin(self, token: int) -> int | None:
        """The first token of the same word in the other case (None for uncased tokens)."""
        if token in self._twin:
            return self._twin[token]
        twin = None
        if self.case_of(token) != UNCASED:
            piece = self._piece(token)
            flipped = " " + (piece[1].lower() if piece[1].isupper() else piece[1].upper()) + piece[2:]
            tokens = self._tokenize(flipped)
            twin = int(tokens[0]) if tokens and int(tokens[0]) != token else None
        self._twin[token] = twin
        return twin
