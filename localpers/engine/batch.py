"""Several prompts side by side: greedy generation and teacher-forced scoring in llama.cpp sequences.

CARD's fit runs the cluster model on ~20 of the user's prompts: a greedy output (y-) for each, then the
user's output and y- scored after the same prompt. One at a time, each generated token is a matrix-vector
pass over the whole model; with one token of each of up to `Engine.batch_sequences` prompts in one
llama_decode it becomes one matrix-matrix pass, which costs a few single steps instead of eight.

Each prompt of a group gets its own sequence (1..batch_sequences) of the engine's KV cache (sequence 0,
the engine's ordinary single-sequence work, is not touched): the prompt is evaluated once, generation
continues it, and each continuation to score is evaluated after the prompt with the generated tokens
dropped. Greedy means the argmax of the logits, with `generate`'s stop rules (end-of-generation token,
stop strings, `max_tokens`). Batched and single evaluation differ by float noise (docs/PERFORMANCE.md), so
a greedy token may rarely differ from `generate`'s. This module decides nothing about what to generate
or score; callers (`localpers.methods.card.pairs`) do.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from localpers.engine.generation import _StopScanner
from localpers.engine.model import SEQUENCE_CELLS, Engine, ScoredContinuation, _log_softmax_at


@dataclass
class PromptJob:
    """One prompt: whether to generate after it, and (given what was generated) what to score after it."""

    prompt: list[int]
    generate: bool
    continuations: Callable[[str], list[list[int]]]  # generated text (stripped) -> token lists to score


@dataclass
class PromptOutcome:
    text: str  # the greedy output (stripped), "" when not generated
    scored: list[ScoredContinuation]


def fits(job: PromptJob, max_tokens: int, longest_continuation: int) -> bool:
    """Whether a job's prompt, generation and continuation fit one batched sequence."""
    return len(job.prompt) + max(max_tokens, longest_continuation) <= SEQUENCE_CELLS


def run_jobs(
    engine: Engine,
    jobs: Sequence[PromptJob],
    *,
    max_tokens: int,
    stop: Sequence[str] = (),
    logprob_rows: int = 1,
    timings: dict[str, float] | None = None,
) -> list[PromptOutcome]:
    """Generate and score every job, `engine.batch_sequences` prompts at a time (see `fits` first)."""
    size = engine.batch_sequences
    if size < 1:
        raise ValueError("the engine has no batched sequences (Engine(..., batch_sequences=N))")
    outcomes: list[PromptOutcome] = []
    for start in range(0, len(jobs), size):
        outcomes += _run_group(engine, jobs[start : start + size], max_tokens, stop, logprob_rows, timings)
    return outcomes


def _run_group(
    engine: Engine,
    jobs: Sequence[PromptJob],
    max_tokens: int,
    stop: Sequence[str],
    logprob_rows: int,
    timings: dict[str, float] | None,
) -> list[PromptOutcome]:
    sequences = list(range(1, len(jobs) + 1))
    started = time.perf_counter()
    first_logits: list[np.ndarray] = []
    first_features: list[np.ndarray | None] = []
    try:
        for job, sequence in zip(jobs, sequences, strict=True):
            engine.forget_sequence(sequence)
            for offset in range(0, len(job.prompt), 256):
                chunk = job.prompt[offset : offset + 256]
                logits, features = engine.eval_sequences(
                    chunk, range(offset, offset + len(chunk)), [sequence] * len(chunk), all_outputs=False
                )
            first_logits.append(np.array(logits[-1], dtype=np.float32))
            first_features.append(None if features is None else features[-1].copy())
        texts = _greedy(engine, jobs, sequences, first_logits, max_tokens, stop)
        generated_at = time.perf_counter()
        outcomes = [PromptOutcome(text, []) for text in texts]
        wanted = [job.continuations(text) for job, text in zip(jobs, texts, strict=True)]
        for round_index in range(max((len(w) for w in wanted), default=0)):
            tokens: list[int] = []
            positions: list[int] = []
            owners: list[tuple[int, int]] = []  # (job index, number of rows)
            batch_sequences: list[int] = []
            for index, (job, sequence) in enumerate(zip(jobs, sequences, strict=True)):
                if round_index >= len(wanted[index]):
                    continue
                engine.forget_sequence(sequence, len(job.prompt))
                body = wanted[index][round_index][:-1]
                tokens += body
                positions += range(len(job.prompt), len(job.prompt) + len(body))
                batch_sequences += [sequence] * len(body)
                owners.append((index, len(body)))
            # the logits of the continuations' own rows are needed only beyond the first (the prompt's) row
            rows_logits, rows_features = (
                engine.eval_sequences(
                    tokens, positions, batch_sequences, all_outputs=True, logits=logprob_rows > 1
                )
                if tokens
                else (None, None)
            )
            row = 0
            for index, count in owners:
                continuation = wanted[index][round_index]
                logits = [first_logits[index][None, :]]
                features = [] if first_features[index] is None else [first_features[index][None]]
                if count:
                    if rows_logits is not None:
                        logits.append(rows_logits[row : row + count])
                    if rows_features is not None:
                        features.append(rows_features[row : row + count])
                row += count
                rows = min(logprob_rows, len(continuation))
                # a copy of the rows needed (the rest is a view into llama.cpp's buffer)
                head = _first_rows(logits, rows)
                outcomes[index].scored.append(
                    ScoredContinuation(
                        tokens=list(continuation),
                        logprobs=_log_softmax_at(head[:rows], np.asarray(continuation[:rows])),
                        features=np.concatenate(features, axis=0) if features else None,
                        logits=None,
                    )
                )
        if timings is not None:
            generating = any(job.generate for job in jobs)
            timings["negatives" if generating else "features"] += generated_at - started
            timings["features"] += time.perf_counter() - generated_at
        return outcomes
    finally:
        for sequence in sequences:
            engine.forget_sequence(sequence)


def _first_rows(pieces: list[np.ndarray], rows: int) -> np.ndarray:
    """The first `rows` rows of the pieces stacked, without copying the rest."""
    taken: list[np.ndarray] = []
    for piece in pieces:
        if rows <= 0:
            break
        taken.append(piece[:rows])
        rows -= len(taken[-1])
    return np.concatenate(taken, axis=0)


def _greedy(
    engine: Engine,
    jobs: Sequence[PromptJob],
    sequences: list[int],
    first_logits: list[np.ndarray],
    max_tokens: int,
    stop: Sequence[str],
) -> list[str]:
    """Each generating job's greedy text (stripped), all live sequences advancing one token per decode."""
    texts = [""] * len(jobs)
    generated: dict[int, list[int]] = {i: [] for i, job in enumerate(jobs) if job.generate}
    scanners = {i: _StopScanner(stop) for i in generated}
    logits_of = {i: first_logits[i] for i in generated}
    live = sorted(generated)
    while live:
        still: list[int] = []
        for index in live:
            token = int(np.argmax(logits_of[index]))
            if engine.is_end_of_generation(token):
                continue
            tokens = generated[index]
            tokens.append(token)
            text = engine.detokenize(tokens)
            cut = scanners[index].find_stop(text)
            if cut is not None:
                texts[index] = text[:cut]
                continue
            texts[index] = text
            if len(tokens) < max_tokens:
                still.append(index)
        live = still
        if not live:
            break
        logits, _ = engine.eval_sequences(
            [generated[i][-1] for i in live],
            [len(jobs[i].prompt) + len(generated[i]) - 1 for i in live],
            [sequences[i] for i in live],
            all_outputs=True,
        )
        logits_of = {i: logits[row] for row, i in enumerate(live)}
    return [text.strip() for text in texts]
