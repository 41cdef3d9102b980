"""A word-only repetition rule for the sampler chain: a word the output already holds loses a fixed logit.

llama.cpp's presence and frequency penalties act on tokens, and Gemma spells numbers digit by digit and quotes as
tokens of their own, so those penalties rewrite numbers ("100 Million" becomes "10 Million") and quotes while
they remove repeated words (RESULTS 0ze). This rule acts on words only: a candidate token that spells a word of
3 or more letters, not a stop word, that an earlier token of the output spelled (in any casing, with or without
its leading space) loses `penalty` nats. It sees the chain's top candidates only (the method's k; without a
method, the settings' top-k or else `CANDIDATES`, so sampled decoding with the rule draws from that many), and
costs a few dictionary lookups a step.

What it does not do: judge a word split over several tokens (each token is judged alone) or look at the prompt;
teacher-forced scoring (`generation._score_forced`: the gold likelihood, the fit's choice) runs without it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from localpers.engine.decoding import Candidates

CANDIDATES = 20  # the top-k cut in front of the rule when no method makes one (CARD's own k)
MIN_LETTERS = 3
# function words a headline may repeat ("The ... The", "Is ... Is"); shared with scripts/decode_variants.py and
# scripts/repeat_stats.py, which measured the rule
STOP_WORDS = frozenset(
    re.findall(
        r"\w+",
        "the a an to of in on for and or is are was were be with at by from as it its that this his her he she they "
        "we you i our their who what when how why not but",
    )
)


class RepeatedWordRule:
    """A `MethodSampler`: candidates spelling a word the output already holds lose `penalty` nats."""

    name = "repeated-words"
    candidate_limit = None  # the sampler chain puts it behind the method's cut, or a cut of its own

    def __init__(self, penalty: float, token_bytes: Callable[[int], bytes]) -> None:
        self.penalty = float(penalty)
        self._token_bytes = token_bytes
        self._words: dict[int, str] = {}
        self.seen: set[str] = set()

    def word_of(self, token: int) -> str:
        """The lower-case word `token` spells, or "" (too short, not letters only, or a stop word)."""
        word = self._words.get(token)
        if word is None:
            text = self._token_bytes(token).decode("utf-8", errors="replace").strip().lower()
            keep = len(text) >= MIN_LETTERS and text.isalpha() and text not in STOP_WORDS
            word = self._words[token] = text if keep else ""
        return word

    def apply(self, candidates: Candidates, features: np.ndarray | None) -> None:
        if not self.seen:
            return
        repeated = np.fromiter(
            (self.word_of(int(token)) in self.seen for token in candidates.ids),
            dtype=bool,
            count=candidates.size,
        )
        if repeated.any():
            candidates.logits[repeated] -= self.penalty

    def accept(self, token: int) -> None:
        word = self.word_of(int(token))
        if word:
            self.seen.add(word)
