"""Teacher-forced scoring of several prompts side by side, in the engine's batched sequences.

`SideBySideScorer.score_each(prompts, continuations)` gives what `PrefixScorer.score` gives for each prompt in
turn: `log p(y | prompt)` summed over tokens, for every continuation y. The prompts' longest common prefix is
evaluated once, in sequence 0 (as `PrefixScorer` does, reusing what the cache holds); batched sequences
1..`batch_sequences` then get its keys and values by reference (`Engine.branch_sequence`), one prompt each. In
round 0 every prompt's remaining tokens and its first continuation but the last token go through as few
llama_decode calls as `batch_capacity` allows; in each later round every sequence drops what followed its prompt
and takes the next continuation. A token's logits are asked for only where a log-probability is read (the
prompt's last token and the continuations' tokens), and read at once with `log_norms` (the same float32 rows
and float64 sums as `token_logprobs`). The batched sequences are emptied after every group.

Numbers differ from one-at-a-time scoring by llama.cpp's batch-split noise (tests/test_exact_side_by_side.py
measures how much). When the engine has fewer than two batched sequences, and when a prompt's own tokens and its
longest continuation would not fit a batched sequence (`SEQUENCE_CELLS`) or sequence 0's context (`fit`), the
prompts are scored one at a time (`PrefixScorer.score_each`), as a single prompt is unless the caller asks for side
by side (`side_by_side`, which also lets a caller score every prompt of a search one way). It builds no prompt and
chooses no adapter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from localpers.engine import Engine
from localpers.engine.model import SEQUENCE_CELLS
from localpers.engine.steps import check_tokens
from localpers.methods.scoring import PrefixScorer, common_prefix_length, log_norms

LOGIT_ROWS_AT_ONCE = 32  # rows of 262,144 logits in one log-sum-exp: 32 MiB of float32 temporaries


@dataclass
class _Round:
    """The tokens of one scoring round, in decode order, and where each output row's log-probabilities go.

    `reads[j]` lists `(slot, target)` pairs for token j: its logits' log-probability of `target` is added to
    `totals.flat[slot]`; a token without pairs needs no logits.
    """

    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    sequences: list[int] = field(default_factory=list)
    reads: list[list[tuple[int, int]]] = field(default_factory=list)

    def add(
        self, tokens: Sequence[int], start: int, sequence: int, reads: list[list[tuple[int, int]]]
    ) -> None:
        self.tokens += tokens
        self.positions += range(start, start + len(tokens))
        self.sequences += [sequence] * len(tokens)
        self.reads += reads


class SideBySideScorer(PrefixScorer):
    """A `PrefixScorer` whose `score_each` scores the prompts side by side in batched sequences."""

    def score_each(
        self,
        prompts: Sequence[Sequence[int]],
        continuations: Sequence[Sequence[int]],
        done: Callable[[int], None] | None = None,
        *,
        side_by_side: bool | None = None,
    ) -> list[list[float]]:
        """Each prompt's `score(prompt, continuations)`; `done(n)` after each group of n prompts scored.

        `side_by_side`: None scores two or more prompts side by side where they `fit`, else one at a time; False one
        at a time; True side by side, a single prompt too (a caller keeping every score of a search on one path),
        refusing prompts that do not fit.
        """
        prompts = [list(prompt) for prompt in prompts]
        continuations = [list(continuation) for continuation in continuations]
        if side_by_side is None:
            side_by_side = len(prompts) >= 2 and self.fit(prompts, continuations)
        elif side_by_side and not self.fit(prompts, continuations):
            raise ValueError("these prompts do not fit the batched sequences; score them one at a time")
        if not side_by_side:
            return super().score_each(prompts, continuations, done)
        shared = shared_length(prompts)
        self.hold(prompts[0][:shared])
        results: list[list[float]] = []
        size = self.engine.batch_sequences
        asked = sum(len(continuation) - 1 for continuation in continuations)
        for start in range(0, len(prompts), size):
            group = prompts[start : start + size]
            results += score_group(self.engine, shared, group, continuations)
            for prompt in group:
                self.evaluated_tokens += len(prompt) - shared + asked
                self.requested_tokens += len(prompt) + asked
            if done is not None:
                done(len(group))
        return results

    def fit(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]) -> bool:
        """Whether the prompts can be scored in batched sequences: each one's tokens past their shared prefix and the
        longest continuation within a batched sequence, and within sequence 0's context (else one at a time, which
        refuses the same). Tokens outside the vocabulary are refused in one line."""
        engine = self.engine
        shared = shared_length(prompts) if prompts else 0
        if engine.batch_sequences < 2 or shared < 1 or not continuations:
            return False
        for prompt in prompts:
            check_tokens(engine, prompt, "a prompt")
        for continuation in continuations:
            check_tokens(engine, continuation, "a continuation")
        longest = max(len(continuation) for continuation in continuations) - 1
        return all(
            len(prompt) - shared + longest <= SEQUENCE_CELLS and len(prompt) + longest <= engine.n_ctx
            for prompt in prompts
        )


def shared_length(prompts: Sequence[Sequence[int]]) -> int:
    """The prompts' common prefix length, leaving each at least its last token (whose logits are needed)."""
    shared = min(len(prompt) for prompt in prompts) - 1
    for prompt in prompts[1:]:
        shared = min(shared, common_prefix_length(prompts[0], prompt))
    return max(shared, 0)


def score_group(
    engine: Engine, shared: int, prompts: Sequence[list[int]], continuations: Sequence[list[int]]
) -> list[list[float]]:
    """Score every continuation after each prompt, one batched sequence per prompt (at most `batch_sequences`).

    Sequence 0 must hold the prompts' first `shared` tokens. The batched sequences are empty afterwards.
    """
    sequences = range(1, len(prompts) + 1)
    totals = np.zeros((len(prompts), len(continuations)), dtype=np.float64)
    try:
        for sequence in sequences:
            engine.forget_sequence(sequence)
            engine.branch_sequence(sequence, shared)
        _decode_round(engine, _first_round(shared, prompts, continuations), totals)
        for index in range(1, len(continuations)):
            for sequence, prompt in zip(sequences, prompts, strict=True):
                engine.forget_sequence(sequence, len(prompt))
            _decode_round(engine, _later_round(prompts, continuations, index), totals)
    finally:
        for sequence in sequences:
            engine.forget_sequence(sequence)
    return totals.tolist()


def _first_round(shared: int, prompts: Sequence[list[int]], continuations: Sequence[list[int]]) -> _Round:
    """Each prompt's own tokens, then its first continuation but the last token.

    The prompt's last token predicts the first token of every continuation; each continuation token predicts the
    next one.
    """
    scored = _Round()
    width = len(continuations)
    for row, prompt in enumerate(prompts):
        own = prompt[shared:]
        first_tokens = [(row * width + index, c[0]) for index, c in enumerate(continuations)]
        scored.add(own, shared, row + 1, [[] for _ in own[:-1]] + [first_tokens])
        body = continuations[0]
        scored.add(body[:-1], len(prompt), row + 1, [[(row * width, token)] for token in body[1:]])
    return scored


def _later_round(prompts: Sequence[list[int]], continuations: Sequence[list[int]], index: int) -> _Round:
    """Continuation `index` but its last token, after each prompt (its first token was read in round 0)."""
    scored = _Round()
    body = continuations[index]
    for row, prompt in enumerate(prompts):
        slot = row * len(continuations) + index
        scored.add(body[:-1], len(prompt), row + 1, [[(slot, token)] for token in body[1:]])
    return scored


def _decode_round(engine: Engine, scored: _Round, totals: np.ndarray) -> None:
    """Evaluate a round in llama_decode calls of at most `batch_capacity` tokens, adding its log-probabilities."""
    capacity = engine.batch_capacity
    for start in range(0, len(scored.tokens), capacity):
        end = min(start + capacity, len(scored.tokens))
        reads = scored.reads[start:end]
        wanted = [bool(pairs) for pairs in reads]
        logits, _ = engine.eval_sequences(
            scored.tokens[start:end],
            scored.positions[start:end],
            scored.sequences[start:end],
            outputs=wanted if any(wanted) else None,  # None: the last token's logits, read by no one
        )
        if any(wanted):
            _add_logprobs(logits, [pairs for pairs in reads if pairs], totals)


def _add_logprobs(logits: np.ndarray, reads: list[list[tuple[int, int]]], totals: np.ndarray) -> None:
    """Add each output row's log-probabilities of its targets to `totals.flat[slot]` (rows read in place)."""
    flat = totals.reshape(-1)
    for start in range(0, len(reads), LOGIT_ROWS_AT_ONCE):
        rows = np.asarray(logits[start : start + LOGIT_ROWS_AT_ONCE], dtype=np.float32)
        norms = log_norms(rows)
        for row, pairs in enumerate(reads[start : start + LOGIT_ROWS_AT_ONCE]):
            for slot, target in pairs:
                flat[slot] += float(rows[row, target]) - norms[row]
