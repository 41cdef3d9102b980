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

Two habits tied to a place in the output are calibrated against the model instead of counted, because a
count ratio from ~20 greedy y- caps near log(20) while a kicker the model gives e^-9 needs more than that:

- `opening`: a first token the user opens with in a share r of their outputs (at least `MIN_HABIT_COUNT`
  times) gets b = logit(r) - logit(p), p = the cluster model's mean probability of that token as the first
  one at the user's own prompts (from the pairs' teacher-forced pass). Added to its logit, it lifts the
  token to about the user's own rate, however unlikely the model finds it;
- `closing`: a punctuation token the user ends outputs with ("?") more often than the model does. When
  the model wants to end (end-of-output tokens among the candidates, and the output does not already end
  with the habit), a share of the ending probability moves to the habit: the output ends with it, then
  ends. A count ratio cannot say *where* to put a closing "?"; pushed anywhere it lands mid-headline.

A casing habit is one signed share, `case`: the part of the model's probability of a word start in the case
the user avoids (capitalised for a sentence-case writer: negative `case`) that moves to the same word's
other-case twin, which joins the candidates (`localpers.methods.card.casing`). Moving probability between
the two spellings of one word, rather than pushing a class of tokens down, keeps the model's choice of words.

This captures habits a headline shows in its tokens (a fixed kicker, "&" for "and", sentence case on common
words, a closing "?") that neither the shared adapters nor a 128-dimensional vector pick up from ~20 items.
It knows nothing of models or files: token ids in, numbers out.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from localpers.methods.card.casing import CAPITALISED, LOWER, UNCASED, TokenCasing

MIN_BIAS = 0.5
MAX_ENTRIES = 200
SMOOTHING = 1.0
CONTEXTS = ("first", "rest", "opening", "closing")
MIN_HABIT_COUNT = 3  # outputs that must show an opening or closing habit (one-offs are not habits)
MIN_HABIT_RATE = 0.25  # ... and this share of the user's outputs
MAX_OPENING_BIAS = 12.0
MAX_CLOSING_SHARE = 0.95  # of the model's end-of-output probability moved to closing habits
MIN_CASED_WORDS = 10  # word starts in the user's outputs before a casing habit is judged
MIN_CASE_SHARE = 0.3
MAX_CASE_SHARE = 0.95


@dataclass
class TokenBias:
    """Per-context token -> bias (natural-log units); empty when fitted on nothing.

    `first` and `rest` are counted and scale with the bias strength; `opening` (log units) and `closing`
    (shares of the ending probability) are calibrated and apply as they are whenever the bias is on.
    """

    first: dict[int, float] = field(default_factory=dict)
    rest: dict[int, float] = field(default_factory=dict)
    opening: dict[int, float] = field(default_factory=dict)
    closing: dict[int, float] = field(default_factory=dict)
    case: float = 0.0  # share moved between a word start's two cases (negative: to lower case); 0 = no habit

    def for_step(self, step: int) -> dict[int, float]:
        """The counted bias table for the `step`-th generated token (0 = the first)."""
        return self.first if step == 0 else self.rest

    def habitual_tokens(self, step: int, emitted: Collection[int] = ()) -> np.ndarray:
        """Token ids the correction must see at `step` (they join its candidates): positive counted biases not
        yet `emitted`, the opening habits at the first step, and the closing habits at every later one."""
        tokens = {t for t, b in self.for_step(step).items() if b > 0 and t not in emitted}
        tokens |= set(self.opening) if step == 0 else set(self.closing)
        return np.array(sorted(tokens), dtype=np.int64)

    def _disfavoured_case(self) -> int:
        return CAPITALISED if self.case < 0 else LOWER

    def case_twins(
        self, tokens: np.ndarray, step: int, casing: TokenCasing | None, last: int | None
    ) -> list[int]:
        """Twins of the `tokens` the casing habit disfavours: the other case must be a candidate too."""
        if not self.case or step == 0 or casing is None:
            return []
        disfavoured = self._disfavoured_case()
        twins = (casing.twin(int(t)) for t in tokens if casing.case_of(int(t), last) == disfavoured)
        return [t for t in twins if t is not None]

    def apply_case(
        self,
        logits: np.ndarray,
        candidates: np.ndarray,
        step: int,
        casing: TokenCasing | None,
        last: int | None,
    ) -> None:
        """Move `|case|` of each disfavoured word start's probability to its twin, in place on the final logits."""
        if not self.case or step == 0 or casing is None:
            return
        disfavoured = self._disfavoured_case()
        share = min(abs(self.case), MAX_CASE_SHARE)
        position = {int(t): i for i, t in enumerate(candidates)}
        original = logits.astype(np.float64)
        for index, token in enumerate(candidates):
            if casing.case_of(int(token), last) != disfavoured:
                continue
            twin = position.get(casing.twin(int(token)) or -1)
            if twin is None:
                continue
            logits[twin] = np.logaddexp(float(logits[twin]), original[index] + math.log(share))
            logits[index] = original[index] + math.log(1.0 - share)

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
        opening = self.opening if step == 0 else {}
        if (not table and not opening) or strength == 0.0:
            return np.zeros(len(candidates), dtype=logits.dtype)
        values = [table.get(int(t), 0.0) for t in candidates]
        if emitted:
            values = [
                min(v, 0.0) if int(t) in emitted else v for t, v in zip(candidates, values, strict=True)
            ]
        return np.array(
            [strength * v + opening.get(int(t), 0.0) for t, v in zip(candidates, values, strict=True)],
            dtype=logits.dtype,
        )

    def apply_closing(
        self, logits: np.ndarray, candidates: np.ndarray, end_tokens: np.ndarray, step: int, last: int | None
    ) -> None:
        """Move a share of the ending probability to the closing habits, in place on the final `logits`.

        Nothing happens at the first step, when no end-of-output token is among the candidates, or when the
        output already ends with a closing habit (`last`): then it may end as the model wants.
        """
        if not self.closing or step == 0 or last in self.closing:
            return
        is_end = np.isin(candidates, end_tokens)
        if not is_end.any():
            return
        ending = logits[is_end].astype(np.float64)
        peak = float(ending.max())
        log_ending = peak + math.log(float(np.exp(ending - peak).sum()))
        total = sum(self.closing.values())
        scale = min(total, MAX_CLOSING_SHARE) / total
        for token, share in self.closing.items():
            where = np.flatnonzero(candidates == token)
            if len(where):
                index = int(where[0])
                logits[index] = np.logaddexp(float(logits[index]), log_ending + math.log(share * scale))
        logits[is_end] += math.log(1.0 - total * scale)

    def __len__(self) -> int:
        return len(self.first) + len(self.rest) + len(self.opening) + len(self.closing) + bool(self.case)

    def to_json(self) -> dict[str, Any]:
        """{"first": [[token, bias], ...], "rest": [...], ..., "case": number}, rounded to 3 decimals."""
        tables: dict[str, Any] = {
            name: [[int(t), round(float(b), 3)] for t, b in sorted(getattr(self, name).items())]
            for name in CONTEXTS
        }
        if self.case:
            tables["case"] = round(float(self.case), 3)
        return tables

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
                    or (name == "closing" and not 0.0 < row[1] <= 1.0)
                ):
                    raise ValueError(
                        f"token bias field {name!r} holds a bad entry {row!r:.60}"
                        + (" (a closing share lies in (0, 1])" if name == "closing" else "")
                    )
                table[row[0]] = float(row[1])
            tables[name] = table
        case = data.get("case", 0.0)
        if not isinstance(case, int | float) or isinstance(case, bool) or not -1.0 <= case <= 1.0:
            raise ValueError(f"token bias field 'case' must be a share between -1 and 1, not {case!r:.40}")
        return cls(**tables, case=float(case))


def describe_habits(bias: TokenBias, piece: Callable[[int], str]) -> list[str]:
    """The calibrated habits in words, for the fit report ("opens with 'Opinion' (+9.1 nats)", ...)."""
    lines = [
        f"opens with {piece(t).strip()!r} (+{b:.1f} nats over the model)" for t, b in bias.opening.items()
    ]
    lines += [
        f"ends with {piece(t).strip()!r} ({share:.0%} of endings moved to it)"
        for t, share in bias.closing.items()
    ]
    if bias.case < 0:
        lines.append(f"writes later words in lower case ({-bias.case:.0%} of capitalised word starts moved)")
    elif bias.case > 0:
        lines.append(f"capitalises later words ({bias.case:.0%} of lower-case word starts moved)")
    return lines


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


def _logit(probability: float) -> float:
    return math.log(probability) - math.log1p(-probability)


def _opening_habits(
    positives: Sequence[Sequence[int]], first_logprobs: Sequence[float | None]
) -> dict[int, float]:
    """Calibrated first-token habits: log(user's rate) - log(model's mean probability at the user's prompts)."""
    outputs = [(tokens[0], lp) for tokens, lp in zip(positives, first_logprobs, strict=True) if tokens]
    counts = Counter(token for token, _ in outputs)
    habits: dict[int, float] = {}
    for token, count in counts.items():
        if count < MIN_HABIT_COUNT or count < MIN_HABIT_RATE * len(outputs):
            continue
        seen = [math.exp(lp) for t, lp in outputs if t == token and lp is not None]
        if not seen:
            continue
        rate = count / (len(outputs) + 1)  # shrunk: 20 of 20 is 0.95, not certainty
        model = min(sum(seen) / len(seen), 1.0 - 1e-6)
        # log-odds: adding b to one logit turns probability p into r exactly when b = logit(r) - logit(p)
        bias = min(_logit(rate) - _logit(model), MAX_OPENING_BIAS)
        if bias >= MIN_BIAS:
            habits[token] = round(bias, 3)
    return habits


def _closing_habits(
    positives: Sequence[Sequence[int]], negatives: Sequence[Sequence[int]], allowed: Collection[int]
) -> dict[int, float]:
    """Closing habits among `allowed` tokens: the share of endings to move so the user's rate is reached."""
    user_last = Counter(tokens[-1] for tokens in positives if tokens)
    model_last = Counter(tokens[-1] for tokens in negatives if tokens)
    n_user, n_model = sum(user_last.values()), sum(model_last.values())
    habits: dict[int, float] = {}
    for token, count in user_last.items():
        if token not in allowed or count < MIN_HABIT_COUNT or count < MIN_HABIT_RATE * n_user:
            continue
        user_rate = count / (n_user + 1)
        model_rate = (model_last[token] + SMOOTHING) / (n_model + 2 * SMOOTHING) if n_model else 0.0
        share = (user_rate - model_rate) / (1.0 - model_rate)
        if share >= 0.1:
            habits[token] = round(share, 3)
    return habits


def _case_share(
    positives: Sequence[Sequence[int]], negatives: Sequence[Sequence[int]], casing: TokenCasing
) -> float:
    """The signed share to move between word-start cases (after each output's first token), or 0.

    u, m = the (add-one smoothed) rate of capitalised word starts in the user's and the model's outputs. A user
    who capitalises less (u < m) gets -(1 - u/m): that share of every capitalised start moves to lower case
    and the rate becomes about u; one who capitalises more gets +(1 - (1-u)/(1-m)) the other way.
    """

    def counts(outputs: Sequence[Sequence[int]]) -> tuple[int, int]:
        cases = [
            casing.case_of(int(tokens[i]), int(tokens[i - 1]))
            for tokens in outputs
            for i in range(1, len(tokens))
        ]
        return sum(c == CAPITALISED for c in cases), sum(c != UNCASED for c in cases)

    (user_caps, user_words), (model_caps, model_words) = counts(positives), counts(negatives)
    if user_words < MIN_CASED_WORDS or not model_words:
        return 0.0
    user = (user_caps + SMOOTHING) / (user_words + 2 * SMOOTHING)
    model = (model_caps + SMOOTHING) / (model_words + 2 * SMOOTHING)
    share = -(1.0 - user / model) if user < model else 1.0 - (1.0 - user) / (1.0 - model)
    return round(share, 3) if abs(share) >= MIN_CASE_SHARE else 0.0


def fit_token_bias(
    positives: Sequence[Sequence[int]],
    negatives: Sequence[Sequence[int]],
    *,
    first_logprobs: Sequence[float | None] | None = None,
    closing_allowed: Collection[int] = (),
    casing: TokenCasing | None = None,
) -> TokenBias:
    """The bias from the user's outputs (`positives`) against the cluster model's (`negatives`), as token ids.

    `first_logprobs[i]`: the cluster model's log-probability of `positives[i]`'s first token at that item's
    prompt (None where unknown); without them there are no opening habits. `closing_allowed`: the tokens
    that may be closing habits (the caller's punctuation tokens); a word that ends many outputs ("Why" in
    "Here's Why") is not a habit to append wherever the model stops. `casing`: the vocabulary's word-start
    cases (None: no casing habit).
    """
    first_pos, rest_pos = _counts(positives)
    first_neg, rest_neg = _counts(negatives)
    first, rest = _log_ratios(first_pos, first_neg), _log_ratios(rest_pos, rest_neg)
    opening = _opening_habits(positives, first_logprobs) if first_logprobs is not None else {}
    closing = _closing_habits(positives, negatives, closing_allowed)
    # A calibrated habit replaces its counted push: pushed anywhere, a closing "?" lands mid-output.
    first = {t: b for t, b in first.items() if not (b > 0 and t in opening)}
    rest = {t: b for t, b in rest.items() if not (b > 0 and t in closing)}
    case = _case_share(positives, negatives, casing) if casing is not None else 0.0
    return TokenBias(first, rest, opening, closing, case)
