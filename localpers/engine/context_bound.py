"""Tokenizing a text that must fit the model's context, without tokenizing the whole of one that cannot.

llama.cpp's tokenizer takes time that grows with the square of a long text full of line breaks (100,000
characters of "a\\n": 31 s on 2 cores): an API request holding the engine while it tokenized a 300 KB text, only
to refuse it as longer than the context, made every other client wait two minutes. `tokens_within_context`
first counts a long text's tokens window by window (each window is cheap, and the count stops as soon as it is
over the limit), so only a text that can fit is tokenized whole. It decides nothing else: evaluating the prompt
still checks it, with what is generated, against the context (`Engine.eval`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from localpers.errors import TextTooLong

if TYPE_CHECKING:
    from localpers.engine.model import Engine

# Characters tokenized at a time while counting a long text: at 4 a token, a whole context's worth of prose.
WINDOW_CHARACTERS = 4096
# Tokens a window's cut can add (a word split in two there is one token in the whole text; three were seen).
CUT_SLACK_TOKENS = 8


def tokens_within_context(
    engine: Engine, text: str, *, add_bos: bool = True, special: bool = False, limit: int | None = None
) -> list[int]:
    """`engine.tokenize(text)`; for a text over WINDOW_CHARACTERS, `TextTooLong` (exit 2) as soon as its windows
    count more than `limit` tokens (default: the context), without tokenizing it all. A shorter text is tokenized
    whole and not checked here: the caller checks the tokens against what is left, with its own words (every caller
    does). A caller assembling a prompt from pieces passes each what is left of it."""
    limit = engine.n_ctx if limit is None else limit
    if len(text) > WINDOW_CHARACTERS:
        counted = 0
        for start in range(0, len(text), WINDOW_CHARACTERS):
            window = text[start : start + WINDOW_CHARACTERS]
            counted += len(engine.tokenize(window, add_bos=add_bos and start == 0, special=special))
            counted -= CUT_SLACK_TOKENS if start else 0
            if counted > limit:
                room = (
                    f"the model's context of {engine.n_ctx}"
                    if limit == engine.n_ctx
                    else f"the {limit:,} tokens left of the model's context of {engine.n_ctx}"
                )
                raise TextTooLong(
                    f"text too long: its first {start + len(window):,} of {len(text):,} characters alone are over"
                    f" {limit:,} tokens, more than {room} holds; shorten the text"
                )
    return engine.tokenize(text, add_bos=add_bos, special=special)
