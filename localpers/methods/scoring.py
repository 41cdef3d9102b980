"""Teacher-forced scoring of many (prompt, continuations) that share prefixes, reusing the KV cache.

`PrefixScorer.score(prompt, [y1, y2])` returns `log p(y | prompt)` (summed over tokens) for each
continuation. Unlike `Engine.score`, it does not reset the cache between calls: it keeps track of the
tokens the cache holds, truncates to the longest common prefix with the new prompt and evaluates only
the rest. EXACT's greedy search scores ~40 prompts per step that differ only in their last attribute
name, so the article and the chosen attributes are evaluated once per step instead of once per
candidate. `score_each` scores several prompts this way, one after another, and `hold` makes sequence 0
hold a given prefix; `localpers.methods.scoring_batch.SideBySideScorer` builds on both to score a step's
prompts side by side. Everything here runs in sequence 0 of the KV cache. Works on whatever adapter is active;
it does not choose adapters or build prompts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from localpers.engine import Engine
from localpers.engine.steps import check_tokens


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens `a` and `b` share: common_prefix_length([1, 2, 3], [1, 2, 4]) -> 2."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def token_logprobs(logits: np.ndarray, targets: Sequence[int]) -> np.ndarray:
    """log softmax(logits[t])[targets[t]] per row, `(T,)` float64; rows are `(T, n_vocab)` logits.

    `localpers.engine.steps.log_softmax_at` computes the same with every row copied to float64 first (CARD's
    scoring, whose stored fits depend on its exact numbers); this one keeps the rows in float32 and sums in
    float64, sparing EXACT's search a float64 copy of 262,144 logits a token.
    """
    rows = np.asarray(logits, dtype=np.float32)
    return rows[np.arange(len(targets)), np.asarray(targets)].astype(np.float64) - log_norms(rows)


def log_norms(rows: np.ndarray) -> np.ndarray:
    """log sum exp of each float32 row of `(T, n_vocab)` logits, `(T,)` float64 (`token_logprobs`' denominator)."""
    peak = rows.max(axis=1)
    return np.log(np.exp(rows - peak[:, None]).sum(axis=1, dtype=np.float64)) + peak


class PrefixScorer:
    """Scores continuations on one engine, evaluating only what the KV cache does not already hold."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._cached: list[int] = []  # the tokens whose keys/values the cache holds, in order
        self._adapter: tuple[str | None, float] = (engine.active_adapter, engine.active_scale)
        self.evaluated_tokens = 0  # tokens actually run through the model (for cost reports)
        self.requested_tokens = 0  # tokens a scorer without reuse would have run

    def _reusable(self, prompt: Sequence[int]) -> int:
        """How many prompt tokens can stay in the cache (never all: the last one's logits are needed)."""
        return min(self._held(prompt), len(prompt) - 1)

    def _held(self, tokens: Sequence[int]) -> int:
        """How many leading `tokens` sequence 0 of the cache holds now (after checking the engine's state)."""
        engine = self.engine
        if (engine.active_adapter, engine.active_scale) != self._adapter or engine.n_past != len(
            self._cached
        ):
            self._cached = []  # someone switched adapters or used the engine since: start over
            self._adapter = (engine.active_adapter, engine.active_scale)
        return common_prefix_length(self._cached, tokens)

    def hold(self, prefix: Sequence[int]) -> None:
        """Make sequence 0 hold exactly `prefix`, evaluating only what it does not hold yet (no logits kept)."""
        prefix = list(prefix)
        keep = self._held(prefix)
        self.engine.truncate(keep)  # truncate(0) resets
        self._cached = prefix[:keep]  # true even when the evaluation below stops halfway
        if keep < len(prefix):
            self.engine.eval(prefix[keep:], copy_logits=False)
            self.evaluated_tokens += len(prefix) - keep
        self._cached = prefix

    def score_each(
        self,
        prompts: Sequence[Sequence[int]],
        continuations: Sequence[Sequence[int]],
        done: Callable[[int], None] | None = None,
    ) -> list[list[float]]:
        """`score(prompt, continuations)` for each prompt in turn; `done(1)` after each prompt scored."""
        results = []
        for prompt in prompts:
            results.append(self.score(prompt, continuations))
            if done is not None:
                done(1)
        return results

    def score(self, prompt: Sequence[int], continuations: Sequence[Sequence[int]]) -> list[float]:
        """Summed log-prob of each continuation after `prompt` (the prompt includes BOS if wanted).

        An empty prompt or continuation, or a token outside the vocabulary, is refused in one line before anything
        is evaluated, as `SideBySideScorer` refuses it.
        """
        prompt = list(prompt)
        bodies = [list(continuation) for continuation in continuations]
        engine = self.engine
        check_tokens(engine, prompt, "a prompt")
        for body in bodies:
            check_tokens(engine, body, "a continuation")
        keep = self._reusable(prompt)
        engine.truncate(keep)  # truncate(0) resets
        first_logits, _ = engine.eval(prompt[keep:])
        self.evaluated_tokens += len(prompt) - keep
        self.requested_tokens += len(prompt)
        totals = []
        last: list[int] = []
        for tokens in bodies:
            engine.truncate(len(prompt))
            parts = [token_logprobs(first_logits[None, :], tokens[:1])]
            if len(tokens) > 1:
                # Read in place when one batch holds them (a view valid until the next evaluation, used at
                # once): copying and stacking every row's 262,144 logits cost as much as the log-softmax.
                in_place = len(tokens) - 1 <= engine.batch_capacity
                logits, _ = engine.eval(tokens[:-1], all_positions=True, copy_logits=not in_place)
                parts.append(token_logprobs(logits, tokens[1:]))
                self.evaluated_tokens += len(tokens) - 1
                self.requested_tokens += len(tokens) - 1
            totals.append(float(np.concatenate(parts).sum()))
            last = tokens[:-1]
        self._cached = prompt + last
        return totals
