"""What a decoding step should do, as plain data: the settings of llama.cpp's sampler chain and a method's sampler.

`SamplerSettings` names llama.cpp's built-in samplers (temperature, top-k, top-p, min-p, typical, the
repeat/frequency/presence penalties, DRY, logit bias, a GBNF grammar, the seed of the final draw) and the
project's word-only repetition rule (`localpers.engine.repeated_words`); the defaults are greedy decoding, as in
the CARD paper, with the word rule left to the task (None: a writing task's default fills it in through
`for_task`; the engine reads an unset rule as off). `MethodSampler` is the interface of a personalization
method's own sampler (CARD's top-k correction, CoPe's contrast): it sees the chain's current `Candidates` and may
change their logits or drop some.
`localpers.engine` turns both into one llama.cpp sampler chain:

    grammar -> logit bias -> penalties -> DRY -> [top-k(method's k) -> method] -> [repeated words]
            -> top-k -> typical -> top-p -> min-p -> temperature -> seeded draw (or greedy when temperature == 0)

(the repeated-words rule, when on, sits behind a top-k cut of its own when no method makes one: the settings'
top-k, or 20).

This module imports no llama.cpp and decodes nothing (`Candidates.best_positions` uses the compiled `_taps`
helper when it is built, numpy otherwise).
"""

from __future__ import annotations

import ctypes
import math
import numbers
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from localpers.errors import LocalpersError

# llama.cpp takes counts as int32: a larger one would wrap (top_k 2^32 + 1 became 1, greedy).
INT32_MAX = 2**31 - 1
# llama.cpp's own "pick a random seed" value (LLAMA_DEFAULT_SEED).
RANDOM_SEED = 0xFFFFFFFF
DEFAULT_DRY_BREAKERS = ("\n", ":", '"', "*")
MAX_LOGIT_BIAS = 100.0  # OpenAI's range; -inf (the API's -100) bans a token
MAX_GRAMMAR_CHARACTERS = 64 * 1024
MAX_GRAMMAR_NESTING = 256


@dataclass(frozen=True)
class SamplerSettings:
    """The built-in llama.cpp samplers of one generation. `temperature == 0` is greedy decoding."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = no cut
    top_p: float = 1.0  # 1 = no cut
    min_p: float = 0.0  # 0 = no cut
    typical_p: float = 1.0  # 1 = no cut
    repeat_penalty: float = 1.0  # > 1 discourages tokens already generated (CTRL-style)
    frequency_penalty: float = 0.0  # OpenAI-style, per occurrence
    presence_penalty: float = 0.0  # OpenAI-style, once per token seen
    penalty_last_n: int = 256  # how many generated tokens the penalties look back on
    dry_multiplier: float = 0.0  # 0 = DRY off
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias); -inf bans a token
    grammar: str | None = None  # GBNF text; output must match its `root` rule
    seed: int | None = None  # None = a fresh random seed per generation
    dry_breakers: tuple[str, ...] = DEFAULT_DRY_BREAKERS
    # nats off a word the output already holds (`repeated_words`); 0 = off, None = the task's default (`for_task`)
    repeated_word_penalty: float | None = None
    # what a refusal of the grammar calls it: the CLI names its file (not part of the settings' equality)
    grammar_label: str = field(default="the grammar", compare=False)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def word_penalty(self) -> float:
        """The word rule's nats as the engine applies them (an unset rule is off)."""
        return self.repeated_word_penalty or 0.0

    def for_task(self, word_penalty: float) -> SamplerSettings:
        """These settings with a task's default word rule (`localpers.tasks.Task.repeated_word_penalty`) where
        they leave it unset; an explicit value, 0 included, is kept."""
        if self.repeated_word_penalty is not None:
            return self
        return replace(self, repeated_word_penalty=word_penalty)

    @property
    def penalties(self) -> bool:
        return self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    def validated(self) -> SamplerSettings:
        """This object, or a one-line `LocalpersError` naming the first setting of the wrong type or out of range
        (a Python caller's float top-k or text temperature reached llama.cpp's ctypes as a TypeError traceback)."""
        self._check_types()
        checks = (
            (
                "temperature",
                self.temperature,
                math.isfinite(self.temperature) and self.temperature >= 0.0,
                "a finite number >= 0",
            ),
            ("top_k", self.top_k, 0 <= self.top_k <= INT32_MAX, f"in [0, {INT32_MAX}]"),
            ("top_p", self.top_p, 0.0 < self.top_p <= 1.0, "in (0, 1]"),
            ("min_p", self.min_p, 0.0 <= self.min_p < 1.0, "in [0, 1)"),
            ("typical_p", self.typical_p, 0.0 < self.typical_p <= 1.0, "in (0, 1]"),
            ("repeat_penalty", self.repeat_penalty, 0.0 < self.repeat_penalty <= 10.0, "in (0, 10]"),
            (
                "frequency_penalty",
                self.frequency_penalty,
                -2.0 <= self.frequency_penalty <= 2.0,
                "in [-2, 2]",
            ),
            ("presence_penalty", self.presence_penalty, -2.0 <= self.presence_penalty <= 2.0, "in [-2, 2]"),
            (
                "penalty_last_n",
                self.penalty_last_n,
                0 <= self.penalty_last_n <= INT32_MAX,
                f"in [0, {INT32_MAX}]",
            ),
            (
                "dry_multiplier",
                self.dry_multiplier,
                math.isfinite(self.dry_multiplier) and self.dry_multiplier >= 0.0,
                "a finite number >= 0",
            ),
            # below 1 llama.cpp turns DRY off without a word; the penalty is multiplier * base^(repeat - allowed)
            (
                "dry_base",
                self.dry_base,
                math.isfinite(self.dry_base) and self.dry_base >= 1.0,
                "a finite number >= 1",
            ),
            (
                "dry_allowed_length",
                self.dry_allowed_length,
                0 <= self.dry_allowed_length <= INT32_MAX,
                f"in [0, {INT32_MAX}]",
            ),
            (
                "repeated_word_penalty",
                self.repeated_word_penalty,
                self.repeated_word_penalty is None or 0.0 <= self.repeated_word_penalty <= 100.0,
                "in [0, 100]",
            ),
            (
                "seed",
                self.seed,
                self.seed is None
                or (isinstance(self.seed, numbers.Integral) and 0 <= self.seed < RANDOM_SEED),
                "a whole number in [0, 2^32 - 1)",
            ),
        )
        for name, value, ok, expected in checks:
            if not ok:
                raise LocalpersError(f"{name} must be {expected}, got {value}", exit_code=2)
        for token, bias in self.logit_bias:
            # -inf bans a token; +inf (or a bias past float32) made sampling's softmax NaN, picking the last id
            if token < 0 or not (bias == -math.inf or -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS):
                raise LocalpersError(
                    f"logit bias ({token}, {bias}) is invalid: give a token id >= 0 and a bias from"
                    f" -{MAX_LOGIT_BIAS:g} to {MAX_LOGIT_BIAS:g} (or -inf to ban it)",
                    exit_code=2,
                )
        if self.grammar is not None:
            _check_grammar(self.grammar)
        return self

    def _check_types(self) -> None:
        """Refuse, in one line, a setting that is not a number of its kind (whole numbers where llama.cpp takes
        int32), before any range is compared (a text temperature could not be)."""
        wholes = {"top_k": self.top_k, "penalty_last_n": self.penalty_last_n}
        wholes |= {"dry_allowed_length": self.dry_allowed_length, "seed": self.seed}
        for name, value in wholes.items():
            if not (_is_whole(value) or (name == "seed" and value is None)):
                raise LocalpersError(f"{name} must be a whole number, got {value!r}", exit_code=2)
        numbers_of = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "typical_p": self.typical_p,
            "repeat_penalty": self.repeat_penalty,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
            "dry_multiplier": self.dry_multiplier,
            "dry_base": self.dry_base,
            "repeated_word_penalty": self.repeated_word_penalty,
        }
        for name, value in numbers_of.items():
            if not (_is_number(value) or (name == "repeated_word_penalty" and value is None)):
                raise LocalpersError(f"{name} must be a number, got {value!r}", exit_code=2)
        for pair in self.logit_bias:
            if not (
                isinstance(pair, tuple) and len(pair) == 2 and _is_whole(pair[0]) and _is_number(pair[1])
            ):
                raise LocalpersError(
                    f"logit bias {pair!r} is invalid: give (token id, bias) pairs, a whole-number token id and a"
                    " numeric bias",
                    exit_code=2,
                )
        if self.grammar is not None and not isinstance(self.grammar, str):
            raise LocalpersError(
                f"the grammar must be GBNF text, got {type(self.grammar).__name__}", exit_code=2
            )


def _is_whole(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_grammar(grammar: str) -> None:
    """Refuse a grammar llama.cpp's parser should not be given: an empty one, one over MAX_GRAMMAR_CHARACTERS, or
    one nested deeper than MAX_GRAMMAR_NESTING (its parser recurses: 30,000 levels crashed the process)."""
    if not grammar.strip():
        raise LocalpersError("the grammar is empty; give GBNF text with a `root` rule", exit_code=2)
    if len(grammar) > MAX_GRAMMAR_CHARACTERS:
        raise LocalpersError(
            f"the grammar has {len(grammar):,} characters, more than the {MAX_GRAMMAR_CHARACTERS:,} localpers takes;"
            " give a shorter one",
            exit_code=2,
        )
    depth = deepest = 0
    for (
        character
    ) in grammar:  # a bound, not a parse: brackets in quoted text count too, which errs on the safe side
        if character in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif character in ")]}":
            depth = max(depth - 1, 0)
    if deepest > MAX_GRAMMAR_NESTING:
        raise LocalpersError(
            f"the grammar nests {deepest} levels of brackets, more than the {MAX_GRAMMAR_NESTING} localpers takes;"
            " write it with named rules instead",
            exit_code=2,
        )


GREEDY = SamplerSettings()


def _c_top_k_positions() -> Any:
    """`localpers_top_k_positions` from the compiled extension (`_taps.c`), or None when it was not built."""
    try:
        from localpers import _taps

        function = ctypes.CDLL(_taps.__file__).localpers_top_k_positions
    except (ImportError, OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p]
    function.restype = ctypes.c_int32
    return function


_TOP_K_POSITIONS = _c_top_k_positions()


class Candidates:
    """The sampler chain's current candidate tokens (llama.cpp's `llama_token_data_array`) as numpy views.

    `ids` and `logits` have one entry per candidate; writing `logits` changes what the rest of the chain
    sees. `keep(mask)` drops the others (the order of the kept ones is preserved). Valid only during the
    `apply` call that received it.
    """

    def __init__(self, entries: np.ndarray) -> None:
        self._entries = entries
        self.size = len(entries)

    @property
    def ids(self) -> np.ndarray:
        return self._entries["id"][: self.size]

    @property
    def logits(self) -> np.ndarray:
        return self._entries["logit"][: self.size]

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the candidates where `mask` is true (at least one must be)."""
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != (self.size,):
            raise ValueError(f"mask has shape {mask.shape}, expected ({self.size},)")
        kept = self._entries[: self.size][mask]
        if kept.size == 0:
            raise LocalpersError("a sampler dropped every candidate token")
        self._entries[: kept.size] = kept
        self.size = int(kept.size)

    def best_positions(self, k: int) -> np.ndarray:
        """Positions of the `k` highest-logit candidates, best first (ties: the earlier position first)."""
        k = min(int(k), self.size)
        if k <= 0:
            return np.zeros(0, dtype=np.int64)
        if _TOP_K_POSITIONS is not None and self._entries.flags.c_contiguous:
            out = np.empty(k, dtype=np.int32)
            found = _TOP_K_POSITIONS(self._entries.ctypes.data, self.size, k, out.ctypes.data)
            return out[:found].astype(np.int64)
        logits = self.logits
        valid = np.flatnonzero(~np.isnan(logits))
        if len(valid) > k:  # everything tied with the k-th best stays, so ties resolve by position below
            values = logits[valid]
            valid = valid[values >= np.partition(values, len(values) - k)[len(values) - k]]
        return valid[np.lexsort((valid, -logits[valid]))][:k]

    def select(self, positions: np.ndarray) -> None:
        """Keep only the candidates at `positions` (indices into the current candidates), in that order."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size == 0:
            raise LocalpersError("a sampler dropped every candidate token")
        if positions.min() < 0 or positions.max() >= self.size:
            raise ValueError(f"positions out of range for {self.size} candidates")
        kept = self._entries[positions]  # fancy indexing copies, so overlapping ranges are safe
        self._entries[: kept.size] = kept
        self.size = int(kept.size)


class MethodSampler(Protocol):
    """A personalization method's step in the chain, placed after `top_k(candidate_limit)`, before the pick.

    `apply` gets the candidates and the tapped layer features of the position being predicted (None when
    the engine has no taps); `accept` is told each token the chain chose. A chain serves one generation.
    """

    name: str
    candidate_limit: int | None  # keep only the k best tokens before this sampler; None = all of them

    def apply(self, candidates: Candidates, features: np.ndarray | None) -> None: ...

    def accept(self, token: int) -> None: ...
