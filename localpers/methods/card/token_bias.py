"""A user's sparse token bias: which tokens they write more (or less) often than their cluster model does.

Fitted on the device from the same preference pairs CARD's vector uses: y+ = the user's own output, y- = the
cluster model's output for the same prompt. For each token, in two contexts ("first", the first token of an
output, and "rest", every later one), the bias is the smoothed log-ratio of its rate in the y+ outputs to its
rate in the y- outputs:

    b(t) = log((c+(t) + a) / (N+ + a M)) - log((c-(t) + a) / (N- + a M))

(a = 1 add-one smoothing, M = the number of distinct tokens seen in that context). Only |b| >= `MIN_BIAS`
is kept, at most `MAX_ENTRIES` per context, so the state stays a few KB. At decoding time the bias is added,
times a strength, inside the same correction as CARD's vector, to the cluster model's top-k candidates and to
the tokens this user habitually writes at that position (positive bias), which join the candidates: a habit
the shared model ranks 21st (a kicker word, "&") could otherwise never show. A habitual token still wins only
where the model's own logit comes within the bias of its best token, so it cannot appear just anywhere.

This captures habits a headline shows in its tokens (a fixed kicker, "&" for "and", sentence case on common
words, a closing "?") that neither the shared adapters nor a 128-dimensional vector pick up from ~20 items.
It knows nothing of models or files: token ids in, numbers out.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MIN_BIAS = 0.5
MAX_ENTRIES = 200
SMOOTHING = 1.0
CONTEXTS = ("first", "rest")


@dataclass
class TokenBias:
    """Per-context token -> bias (natural-log units); empty when fitted on nothing."""

    first: dict[int, float] = field(default_factory=dict)
    rest: dict[int, float] = field(default_factory=dict)

    def for_step(self, step: int) -> dict[int, float]:
        """The bias table for the `step`-th generated token (0 = the first)."""
        return self.first if step == 0 else self.rest

    def habitual_tokens(self, step: int, emitted: Collection[int] = ()) -> np.ndarray:
        """Token ids with a positive bias at `step` and not yet `emitted` (they join the correction's candidates)."""
        return np.array(
            sorted(t for t, b in self.for_step(step).items() if b > 0 and t not in emitted), dtype=np.int64
        )

    def apply(
        self,
        logits: np.ndarray,
        candidates: np.ndarray,
        step: int,
        strength: float,
        emitted: Collection[int] = (),
    ) -> np.ndarray:
        """The bias of each candidate at `step`, times `strength` (zeros where the user shows no habit).

        A positive bias pushes a token until the output holds it (`emitted`: the tokens generated so far):
        the bias says a token is more frequent in the user's outputs, not that it repeats, and pushing it
        again turned a kicker's colon into "Opinion: Joe: How: How: ..." on the style probes.
        """
        table = self.for_step(step)
        if not table or strength == 0.0:
            return np.zeros(len(candidates), dtype=logits.dtype)
        values = [table.get(int(t), 0.0) for t in candidates]
        if emitted:
            values = [
                min(v, 0.0) if int(t) in emitted else v for t, v in zip(candidates, values, strict=True)
            ]
        return np.array([strength * v for v in values], dtype=logits.dtype)

    def __len__(self) -> int:
        return len(self.first) + len(self.rest)

    def to_json(self) -> dict[str, Any]:
        """{"first": [[token, bias], ...], "rest": [...]}, biases rounded to 3 decimals."""
        return {
            name: [[int(t), round(float(b), 3)] for t, b in sorted(getattr(self, name).items())]
            for name in CONTEXTS
        }

    @classmethod
    def from_json(cls, data: Any) -> TokenBias:
        """The inverse of `to_json`; ValueError naming the field on anything malformed."""
        if not isinstance(data, dict):
            raise ValueError("token bias must be an object with 'first' and 'rest'")
        tables: dict[str, dict[int, float]] = {}
        for name in CONTEXTS:
            rows = data.get(name, [])
            if not isinstance(rows, list):
                raise ValueError(f"token bias field {name!r} must be a list of [token, bias]")
            table: dict[int, float] = {}
            for row in rows:
                if (
                    not isinstance(row, list)
                    or len(row) != 2
                    or not isinstance(row[0], int)
                    or isinstance(row[0], bool)
                    or row[0] < 0
                    or not isinstance(row[1], int | float)
                    or not math.isfinite(row[1])
                ):
                    raise ValueError(f"token bias field {name!r} holds a bad entry {row!r:.60}")
                table[row[0]] = float(row[1])
            tables[name] = table
        return cls(**tables)


def _counts(outputs: Sequence[Sequence[int]]) -> tuple[Counter[int], Counter[int]]:
    first: Counter[int] = Counter()
    rest: Counter[int] = Counter()
    for tokens in outputs:
        if tokens:
            first[tokens[0]] += 1
            rest.update(tokens[1:])
    return first, rest


def _log_ratios(positive: Counter[int], negative: Counter[int]) -> dict[int, float]:
    vocabulary = set(positive) | set(negative)
    if not vocabulary:
        return {}
    n_pos, n_neg, size = sum(positive.values()), sum(negative.values()), len(vocabulary)
    ratios = {
        token: math.log((positive[token] + SMOOTHING) / (n_pos + SMOOTHING * size))
        - math.log((negative[token] + SMOOTHING) / (n_neg + SMOOTHING * size))
        for token in vocabulary
    }
    kept = [(t, b) for t, b in ratios.items() if abs(b) >= MIN_BIAS]
    kept.sort(key=lambda pair: (-abs(pair[1]), pair[0]))
    return dict(kept[:MAX_ENTRIES])


def fit_token_bias(positives: Sequence[Sequence[int]], negatives: Sequence[Sequence[int]]) -> TokenBias:
    """The bias from the user's outputs (`positives`) against the cluster model's (`negatives`), as token ids."""
    first_pos, rest_pos = _counts(positives)
    first_neg, rest_neg = _counts(negatives)
    return TokenBias(_log_ratios(first_pos, first_neg), _log_ratios(rest_pos, rest_neg))
