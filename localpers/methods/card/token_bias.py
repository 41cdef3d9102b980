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
  token to about the user's own rate, however unlikely the model finds it. A token of whitespace only is
  never an opening habit: the backbone writes " 🐸" as a bare space and then the emoji, and a habit "opens
  with ' '" only pushes a space. Such an output shows no opening habit (the model's log-probability is of
  its first token, and the habit applies at the first step only, so the token after the space has neither);
- `closing`: a punctuation token the user ends outputs with ("?") more often than the model does. When
  the model wants to end (end-of-output tokens among the candidates, and the output does not already end
  with the habit), a share of the ending probability moves to the habit: the output ends with it, then
  ends. A count ratio cannot say *where* to put a closing "?"; pushed anywhere it lands mid-headline.

A casing habit (sentence case, Title Case, all lower case, all capitals) is not a token bias: it travels
with it as `recasing` and is applied to the finished words (`localpers.methods.card.recasing`), so it leaves
the model's words alone. So does a spelling habit ("&" for "and": `respelling`,
`localpers.methods.card.respelling`); `finish` applies both.

This captures habits a headline shows in its tokens (a fixed kicker, "&" for "and", a closing "?") that neither the shared adapters nor a 128-dimensional vector pick up from ~20 items.
It knows nothing of models or files: token ids in, numbers out.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from localpers.methods.card.recasing import Recasing
from localpers.methods.card.respelling import Respelling

MIN_BIAS = 0.5
MAX_ENTRIES = 200
SMOOTHING = 1.0
CONTEXTS = ("first", "rest", "opening", "closing")
MIN_HABIT_COUNT = 3  # outputs that must show an opening or closing habit (one-offs are not habits)
MIN_HABIT_RATE = 0.25  # ... and this share of the user's outputs
MAX_OPENING_BIAS = 12.0
MAX_CLOSING_SHARE = 0.95  # of the model's end-of-output probability moved to closing habits
MAX_STORED_BIAS = 1000.0  # nats; a fit's habits are a few, a counted table's tens at most
MAX_TOKEN_ID = 2**31  # a stored token id is below it (llama_token is int32)


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
    recasing: Recasing | None = None  # a casing habit, applied to the finished words (not a token bias)
    respelling: Respelling | None = None  # spelling habits ("&" for "and"), applied to the finished words

    @property
    def has_text_habits(self) -> bool:
        """Whether `finish` changes anything: a casing or a spelling habit."""
        return self.recasing is not None or self.respelling is not None

    def finish(self, text: str, source: str = "") -> str:
        """`text` (an output, or a streamed prefix of it) in the user's spelling and case; `source` is the input."""
        if self.respelling is not None:
            text = self.respelling.apply(text)
        if self.recasing is not None:
            text = self.recasing.apply(text, source)
        return text

    def for_step(self, step: int) -> dict[int, float]:
        """The counted bias table for the `step`-th generated token (0 = the first)."""
        return self.first if step == 0 else self.rest

    def habitual_tokens(self, step: int, emitted: Collection[int] = ()) -> np.ndarray:
        """Token ids the correction must see at `step` (they join its candidates): positive counted biases not
        yet `emitted`, the opening habits at the first step, and the closing habits at every later one."""
        tokens = {t for t, b in self.for_step(step).items() if b > 0 and t not in emitted}
        tokens |= set(self.opening) if step == 0 else set(self.closing)
        return np.array(sorted(tokens), dtype=np.int64)

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
        # Python ints: looking up a numpy scalar in a dict costs more than the lookup itself
        tokens = np.asarray(candidates).tolist()
        values = [table.get(t, 0.0) for t in tokens]
        if emitted:
            values = [min(v, 0.0) if t in emitted else v for t, v in zip(tokens, values, strict=True)]
        return np.array(
            [strength * v + opening.get(t, 0.0) for t, v in zip(tokens, values, strict=True)],
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

    def habits_only(self) -> TokenBias:
        """This bias without its counted tables: the calibrated opening and closing habits and the casing habit.

        The counted tables push the user's frequent words everywhere and move the model's word choice; the
        habits act only where they belong (the first token, the end, the case of finished words).
        """
        return TokenBias(
            opening=dict(self.opening),
            closing=dict(self.closing),
            recasing=self.recasing,
            respelling=self.respelling,
        )

    def __len__(self) -> int:
        return len(self.first) + len(self.rest) + len(self.opening) + len(self.closing)

    def to_json(self) -> dict[str, Any]:
        """{"first": [[token, bias], ...], "rest": [...], ..., "case": number}, rounded to 3 decimals."""
        tables: dict[str, Any] = {
            name: [[int(t), round(float(b), 3)] for t, b in sorted(getattr(self, name).items())]
            for name in CONTEXTS
        }
        if self.recasing is not None:
            tables["recasing"] = self.recasing.to_json()
        if self.respelling is not None:
            tables["respelling"] = self.respelling.to_json()
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
                    or not 0 <= row[0] < MAX_TOKEN_ID  # llama.cpp's ids are int32; 2^63 overflowed numpy
                    or not isinstance(row[1], int | float)
                    or not math.isfinite(row[1])
                    or abs(row[1]) > MAX_STORED_BIAS  # a float32 would overflow to inf long before 1e300
                    or (name == "closing" and not 0.0 < row[1] <= 1.0)
                ):
                    raise ValueError(
                        f"token bias field {name!r} holds a bad entry {row!r:.60}"
                        + (" (a closing share lies in (0, 1])" if name == "closing" else "")
                    )
                table[row[0]] = float(row[1])
            tables[name] = table
        # A fit before recasing may hold "case" (a share moved while decoding, retired): ignored.
        recasing = data.get("recasing")
        try:
            recasing = None if recasing is None else Recasing.from_json(recasing)
        except ValueError as exc:
            raise ValueError(f"token bias field 'recasing': {exc}") from None
        respelling = data.get("respelling")
        try:
            respelling = None if respelling is None else Respelling.from_json(respelling)
        except ValueError as exc:
            raise ValueError(f"token bias field 'respelling': {exc}") from None
        return cls(**tables, recasing=recasing, respelling=respelling)


def _shown(token: int, piece: Callable[[int], str]) -> str:
    """A token for the fit report: its text without the spacing ('Opinion'), as it is where that leaves
    nothing (' '), the token's id where it has no text at all."""
    text = piece(token)
    if text.strip():
        return repr(text.strip())
    return repr(text) if text else f"token {token}"


def describe_habits(bias: TokenBias, piece: Callable[[int], str]) -> list[str]:
    """The calibrated habits in words, for the fit report ("opens with 'Opinion' (+9.1 nats)", ...)."""
    lines = [f"opens with {_shown(t, piece)} (+{b:.1f} nats over the model)" for t, b in bias.opening.items()]
    lines += [
        f"ends with {_shown(t, piece)} ({share:.0%} of endings moved to it)"
        for t, share in bias.closing.items()
    ]
    if bias.recasing is not None:
        lines.append(bias.recasing.describe())
    if bias.respelling is not None:
        lines.append(bias.respelling.describe())
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
    positives: Sequence[Sequence[int]], first_logprobs: Sequence[float | None], blank: Collection[int] = ()
) -> dict[int, float]:
    """Calibrated first-token habits: log(user's rate) - log(model's mean probability at the user's prompts).

    A `blank` first token (whitespace only) is no habit; its output still counts towards the rates.
    """
    outputs = [(tokens[0], lp) for tokens, lp in zip(positives, first_logprobs, strict=True) if tokens]
    counts = Counter(token for token, _ in outputs if token not in blank)
    habits: dict[int, float] = {}
    for token, count in counts.items():
        if count < MIN_HABIT_COUNT or count < MIN_HABIT_RATE * len(outputs):
            continue
        seen = [math.exp(min(lp, 0.0)) for t, lp in outputs if t == token and lp is not None]
        if not seen:
            continue
        rate = count / (len(outputs) + 1)  # shrunk: 20 of 20 is 0.95, not certainty
        model = min(max(sum(seen) / len(seen), 1e-12), 1.0 - 1e-6)  # exp() of a far-off log-prob is 0
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


def fit_token_bias(
    positives: Sequence[Sequence[int]],
    negatives: Sequence[Sequence[int]],
    *,
    first_logprobs: Sequence[float | None] | None = None,
    closing_allowed: Collection[int] = (),
    blank: Collection[int] = (),
) -> TokenBias:
    """The bias from the user's outputs (`positives`) against the cluster model's (`negatives`), as token ids.

    `first_logprobs[i]`: the cluster model's log-probability of `positives[i]`'s first token at that item's
    prompt (None where unknown); without them there are no opening habits. `closing_allowed`: the tokens
    that may be closing habits (the caller's punctuation tokens); a word that ends many outputs ("Why" in
    "Here's Why") is not a habit to append wherever the model stops. `blank`: the tokens of whitespace only
    (the caller's), never an opening habit.
    """
    first_pos, rest_pos = _counts(positives)
    first_neg, rest_neg = _counts(negatives)
    first, rest = _log_ratios(first_pos, first_neg), _log_ratios(rest_pos, rest_neg)
    opening = _opening_habits(positives, first_logprobs, blank) if first_logprobs is not None else {}
    closing = _closing_habits(positives, negatives, closing_allowed)
    # A calibrated habit replaces its counted push: pushed anywhere, a closing "?" lands mid-output.
    first = {t: b for t, b in first.items() if not (b > 0 and t in opening)}
    rest = {t: b for t, b in rest.items() if not (b > 0 and t in closing)}
    return TokenBias(first, rest, opening, closing)
