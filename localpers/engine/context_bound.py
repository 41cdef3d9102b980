"""Tokenizing a text that must fit the model's context, without tokenizing the whole of one that cannot.

llama.cpp's tokenizer takes time that grows with the square of a long text full of line breaks (100,000
characters of "a\\n": 31 s on 2 cores): an API request holding the engine while it tokenized a 300 KB text, only
to refuse it as longer than the context, made every other client wait two minutes. `tokens_within_context`
refuses such a text after tokenizing its beginning, and any text with more bytes than the context's tokens could
stand for. It decides nothing else: evaluating the prompt still checks it, with what is generated, against the
context (`Engine.eval`).
"""

from __future__ import annotations

from localpers.engine.model import Engine
from localpers.errors import TextTooLong

# Characters of a long text's beginning tokenized first: at 4 a token, the context's worth of ordinary text.
PROBE_CHARACTERS_PER_TOKEN = 4
# Tokens the cut at the probe's end can add (a word split in two there is one token in the whole text).
CUT_SLACK_TOKENS = 16


def tokens_within_context(
    engine: Engine, text: str, *, add_bos: bool = True, special: bool = False
) -> list[int]:
    """`engine.tokenize(text)`; `TextTooLong` (exit 2) without tokenizing it all when it cannot fit the context."""
    limit = engine.n_ctx
    probe = limit * PROBE_CHARACTERS_PER_TOKEN
    if len(text) > probe:
        head = engine.tokenize(text[:probe], add_bos=add_bos, special=special)
        if len(head) > limit + CUT_SLACK_TOKENS:
            raise TextTooLong(
                f"text too long: its first {probe:,} of {len(text):,} characters alone are {len(head):,} tokens,"
                f" more than the model's context of {limit}; shorten the text"
            )
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > limit * engine.longest_piece_bytes:
            raise TextTooLong(
                f"text too long: {size:,} bytes are more than the model's context of {limit} tokens can hold"
                f" ({engine.longest_piece_bytes} bytes a token at most); shorten the text"
            )
    return engine.tokenize(text, add_bos=add_bos, special=special)
