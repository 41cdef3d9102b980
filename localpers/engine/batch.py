"""Several prompts side by side: greedy generation and teacher-forced scoring in llama.cpp sequences.

CARD's fit runs the cluster model on ~20 of the user's prompts: a greedy output (y-) for each, then the
user's output and y- scored after the same prompt. One at a time, each generated token is a matrix-vector
pass over the whole model; with one token of each of up to `Engine.batch_sequences` prompts in one
llama_decode it becomes one matrix-matrix pass: 8 rows cost ~3.6 single steps, 16 ~6.6 (AVX2, PERFORMANCE).

Each group starts from an empty KV cache (`Engine.reset`): with the cells earlier rewrites left in it, the
same jobs came out different by float noise, so a fit's y- and pair features depended on what the engine had
done before it (docs/RESULTS.md, section 0zl; which llama.cpp path rounds differently was not isolated: a
prompt merely held in sequence 0 did not reproduce it); from an empty cache they depend on the jobs alone, that
is on which prompts share a group too (a fit grown item by item groups its uncached prompts otherwise than one made
at once, and can differ from it).
The next rewrite evaluates its prompt again, or restores it from the engine's prefix snapshots. Each prompt
of a group gets its own sequence (1..batch_sequences) of the engine's KV cache: the prompt is evaluated
once, generation continues it, and each continuation to score is evaluated after the prompt with the
generated tokens dropped. Prompts that open with the same block of tokens (a job's `shared`: a user's recent
outputs) get it evaluated once per group, as a batch of its own, and the other sequences share its cache cells; a
continuation that is exactly the generated text reuses the generation's own features instead of being
evaluated again. Greedy means the argmax of the logits, with `generate`'s stop rules (end-of-generation token,
stop strings, `max_tokens`). Batched and single evaluation differ by float noise (docs/PERFORMANCE.md), and
greedy decoding carries a near tie on to a different text: 13 of the demo user's 24 y- differed somewhere from
`generate`'s one prompt at a time (eighty-second session). This module decides nothing about what to generate
or score; callers (`localpers.methods.card.pairs`) do.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from localpers.engine.generation import _StopScanner
from localpers.engine.model import SEQUENCE_CELLS, Engine
from localpers.engine.steps import ScoredContinuation, check_tokens, log_softmax_at

# Prompts evaluated side by side: the fit's group size, as many as the device engine's batched sequences (16,
# for a rewrite's candidates). 16 instead of 8 saved ~4% of a 20-item fit with the same quality (dev split;
# PERFORMANCE, thirty-sixth session); a step's cost is nearly linear in its rows beyond 8.
GROUP_SIZE = 16


@dataclass
class PromptJob:
    """One prompt: whether to generate after it, and (given what was generated) what to score after it."""

    prompt: list[int]
    generate: bool
    continuations: Callable[[str], list[list[int]]]  # generated text (stripped) -> token lists to score
    # The first `shared` tokens are a block other jobs' prompts may start with too: it is evaluated as a batch
    # of its own, once per group, and the other sequences get its keys and values by reference.
    shared: int = 0


@dataclass
class PromptOutcome:
    text: str  # the greedy output (stripped), "" when not generated
    scored: list[ScoredContinuation]


def fits(job: PromptJob, max_tokens: int, longest_continuation: int) -> bool:
    """Whether a job's prompt, generation and continuation fit one batched sequence."""
    return len(job.prompt) + max(max_tokens, longest_continuation) <= SEQUENCE_CELLS


def group_size(engine: Engine) -> int:
    """How many prompts `run_jobs` evaluates side by side on `engine` (its batched sequences, at most GROUP_SIZE)."""
    size = min(engine.batch_sequences, GROUP_SIZE)
    if size < 1:
        raise ValueError("the engine has no batched sequences (Engine(..., batch_sequences=N))")
    return size


def run_jobs(
    engine: Engine,
    jobs: Sequence[PromptJob],
    *,
    max_tokens: int,
    stop: Sequence[str] = (),
    logprob_rows: int = 1,
    timings: dict[str, float] | None = None,
) -> list[PromptOutcome]:
    """Generate and score every job, `group_size(engine)` prompts at a time (see `fits` first).

    A caller that wants to report or save after each group passes one group's jobs at a time.
    """
    for job in jobs:
        check_tokens(engine, job.prompt, "a job's prompt")
    if logprob_rows < 1:
        raise ValueError(f"logprob_rows must be at least 1, not {logprob_rows}")
    size = group_size(engine)
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
    engine.reset()
    sequences = list(range(1, len(jobs) + 1))
    started = time.perf_counter()
    first_logits: list[np.ndarray] = []
    first_features: list[np.ndarray | None] = []
    blocks: dict[tuple[int, ...], int] = {}  # a shared block -> the sequence that holds it
    try:
        for job, sequence in zip(jobs, sequences, strict=True):
            engine.forget_sequence(sequence)
            shared = job.shared if 0 < job.shared < len(job.prompt) else 0
            block = tuple(job.prompt[:shared])
            if shared and block in blocks:
                engine.share_sequence(blocks[block], sequence, shared)
            elif shared:
                _evaluate(engine, job.prompt, 0, shared, sequence)
                blocks[block] = sequence
            logits, features = _evaluate(engine, job.prompt, shared, len(job.prompt), sequence)
            first_logits.append(np.array(logits[-1], dtype=np.float32))
            first_features.append(None if features is None else features[-1].copy())
        texts, walked = _greedy(engine, jobs, sequences, first_logits, max_tokens, stop)
        generated_at = time.perf_counter()
        outcomes = [PromptOutcome(text, []) for text in texts]
        wanted = [job.continuations(text) for job, text in zip(jobs, texts, strict=True)]
        for continuations in wanted:
            for continuation in continuations:
                check_tokens(engine, continuation, "a continuation")
        # A continuation that is the generated text's own tokens was evaluated by the generation already: its
        # features are reused (when only the first row's log-probability is asked, which the prompt's logits give).
        reused = [
            [
                _reusable(
                    continuation, walked[index], first_logits[index], first_features[index], logprob_rows
                )
                for continuation in continuations
            ]
            for index, continuations in enumerate(wanted)
        ]
        for round_index in range(max((len(w) for w in wanted), default=0)):
            for index, continuations in enumerate(wanted):
                ready = reused[index][round_index] if round_index < len(continuations) else None
                if ready is not None:
                    outcomes[index].scored.append(ready)
            owners = [
                index
                for index in range(len(jobs))
                if round_index < len(wanted[index]) and reused[index][round_index] is None
            ]
            for part in _within_capacity(owners, wanted, round_index, engine.batch_capacity):
                _score_round(
                    engine,
                    jobs,
                    sequences,
                    part,
                    wanted,
                    round_index,
                    first_logits,
                    first_features,
                    logprob_rows,
                    outcomes,
                )
        if timings is not None:
            generating = any(job.generate for job in jobs)
            timings["negatives" if generating else "features"] += generated_at - started
            timings["features"] += time.perf_counter() - generated_at
        return outcomes
    finally:
        for sequence in sequences:
            engine.forget_sequence(sequence)


def _evaluate(
    engine: Engine, prompt: list[int], start: int, end: int, sequence: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """Evaluate `prompt[start:end]` into `sequence`; the last token's logits and features."""
    step = min(256, engine.batch_capacity)  # an engine made with a smaller n_batch takes no more at once
    for offset in range(start, end, step):
        chunk = prompt[offset : min(offset + step, end)]
        logits, features = engine.eval_sequences(
            chunk, range(offset, offset + len(chunk)), [sequence] * len(chunk), all_outputs=False
        )
    return logits, features


def _within_capacity(
    owners: list[int], wanted: list[list[list[int]]], round_index: int, capacity: int
) -> list[list[int]]:
    """The jobs of one scoring round in consecutive parts whose continuations fit one llama_decode each."""
    parts: list[list[int]] = [[]]
    used = 0
    for index in owners:
        size = len(wanted[index][round_index]) - 1
        if parts[-1] and used + size > capacity:
            parts.append([])
            used = 0
        parts[-1].append(index)
        used += size
    return [part for part in parts if part]


def _score_round(
    engine: Engine,
    jobs: Sequence[PromptJob],
    sequences: list[int],
    part: list[int],
    wanted: list[list[list[int]]],
    round_index: int,
    first_logits: list[np.ndarray],
    first_features: list[np.ndarray | None],
    logprob_rows: int,
    outcomes: list[PromptOutcome],
) -> None:
    """Score one continuation of each job in `part` after its prompt, in one llama_decode (the generated
    tokens are dropped first); appends a `ScoredContinuation` to each job's outcome."""
    tokens: list[int] = []
    positions: list[int] = []
    batch_sequences: list[int] = []
    for index in part:
        prompt_length = len(jobs[index].prompt)
        engine.forget_sequence(sequences[index], prompt_length)
        body = wanted[index][round_index][:-1]
        tokens += body
        positions += range(prompt_length, prompt_length + len(body))
        batch_sequences += [sequences[index]] * len(body)
    # the logits of the continuations' own rows are needed only beyond the first (the prompt's) row
    rows_logits, rows_features = (
        engine.eval_sequences(tokens, positions, batch_sequences, all_outputs=True, logits=logprob_rows > 1)
        if tokens
        else (None, None)
    )
    row = 0
    for index in part:
        continuation = wanted[index][round_index]
        count = len(continuation) - 1
        logits = [first_logits[index][None, :]]
        features = [] if first_features[index] is None else [first_features[index][None]]
        if count:
            if rows_logits is not None:
                logits.append(rows_logits[row : row + count])
            if rows_features is not None:
                features.append(rows_features[row : row + count])
        row += count
        rows = min(logprob_rows, len(continuation))
        # a copy of the rows needed (the rest is a view into llama.cpp's buffer, valid until the next decode)
        head = _first_rows(logits, rows)
        outcomes[index].scored.append(
            ScoredContinuation(
                tokens=list(continuation),
                logprobs=log_softmax_at(head[:rows], np.asarray(continuation[:rows])),
                features=np.concatenate(features, axis=0) if features else None,
                logits=None,
            )
        )


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
) -> tuple[list[str], list[tuple[list[int], list[np.ndarray]]]]:
    """Each generating job's greedy text (stripped), all live sequences advancing one token per decode.

    Also, per job, the generated tokens and the tap features of those that were evaluated (row t: after
    evaluating token t), which is what scoring those tokens as a continuation would compute again.
    """
    texts = [""] * len(jobs)
    generated: dict[int, list[int]] = {i: [] for i, job in enumerate(jobs) if job.generate}
    walked_features: dict[int, list[np.ndarray]] = {i: [] for i in generated}
    scanners = {i: _StopScanner(stop) for i in generated}
    logits_of = {i: first_logits[i] for i in generated}
    live = sorted(generated) if max_tokens > 0 else []  # no token asked for, as `generate` gives none
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
        logits, features = engine.eval_sequences(
            [generated[i][-1] for i in live],
            [len(jobs[i].prompt) + len(generated[i]) - 1 for i in live],
            [sequences[i] for i in live],
            all_outputs=True,
        )
        logits_of = {i: logits[row] for row, i in enumerate(live)}
        if features is not None:
            for row, i in enumerate(live):
                walked_features[i].append(features[row])
    walked = [(generated.get(i, []), walked_features.get(i, [])) for i in range(len(jobs))]
    return [text.strip() for text in texts], walked


def _reusable(
    continuation: list[int],
    walked: tuple[list[int], list[np.ndarray]],
    first_logits: np.ndarray,
    first_features: np.ndarray | None,
    logprob_rows: int,
) -> ScoredContinuation | None:
    """The scored continuation from the generation's own pass, when it walked exactly these tokens; else None.

    Row t's features are those before choosing token t: the prompt's last row, then the generation's rows of
    tokens 0..n-2. Only the first row's log-probability can be given (from the prompt's logits; the generation
    kept no later ones), so this applies only when no more is asked.
    """
    tokens, features = walked
    if logprob_rows > 1 or first_features is None or not continuation:
        return None
    if tokens[: len(continuation)] != continuation or len(features) < len(continuation) - 1:
        return None
    rows = [first_features[None]]
    if len(continuation) > 1:
        rows.append(np.stack(features[: len(continuation) - 1]))
    return ScoredContinuation(
        tokens=list(continuation),
        logprobs=log_softmax_at(first_logits[None, :], np.asarray(continuation[:1])),
        features=np.concatenate(rows, axis=0),
        logits=None,
    )
