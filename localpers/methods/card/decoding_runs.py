"""The personalizer's decode runs: a rewrite (one candidate or consensus), teacher-forced scoring, the Why view.

`decode_rewrite` is a rewrite's decode (one candidate, or consensus), `check_candidates` refuses what it cannot
do. `decode_consensus` decodes several candidates side by side (`localpers.engine.candidates`: the greedy one and
samples drawn as `candidate_sampling` says for their number), each with a fresh correction sampler, and keeps
the one the others agree with most (`localpers.methods.consensus`).
`score_references` and `score_reference_run` score a given output teacher-forced through the corrections a
rewrite would decode with (the benchmark's gold likelihood, the per-user choice). `describe_steps` turns a
correction's records into the per-step candidate shifts the Why view shows. These functions take an engine
whose adapter is already set; which adapter, prompt and correction a method uses is the personalizer's call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
from threadpoolctl import threadpool_limits

from localpers.engine import Engine
from localpers.engine.candidates import generate_candidates
from localpers.engine.decoding import SamplerSettings
from localpers.engine.generation import GenerationResult, generate, score_forced
from localpers.errors import LocalpersError
from localpers.methods.card.correction import CardCorrection, CorrectionRecord
from localpers.methods.consensus import MAX_CANDIDATES, choose_consensus
from localpers.methods.reports import CandidateShift, RewriteStep

# How a rewrite's extra candidates are drawn (`candidates` > 1); the top-k cut only spares the sampler
# sorting the whole vocabulary: top-p 0.95 keeps fewer tokens than that at almost every step.
CANDIDATE_SAMPLING = SamplerSettings(temperature=0.7, top_k=64, top_p=0.95)
# Up to this many candidates the samples are drawn cooler: a few samples at 0.7 stray too far for their agreement
# to beat the greedy output (4 candidates: -0.005 R-1 against greedy at 0.7, +0.005 at 0.5), while 12-16 agree
# best at 0.7 (RESULTS 0zb, chosen on train authors' items).
FEW_CANDIDATES = 8
FEW_CANDIDATE_SAMPLING = dataclasses.replace(CANDIDATE_SAMPLING, temperature=0.5)


def candidate_sampling(count: int) -> SamplerSettings:
    """How the samples of a `count`-candidate rewrite are drawn."""
    return FEW_CANDIDATE_SAMPLING if count <= FEW_CANDIDATES else CANDIDATE_SAMPLING


def check_candidates(candidates: int, sampling: SamplerSettings | None) -> None:
    """Refuse a candidate count out of range, or candidates with non-greedy `sampling` (they draw their own), or
    with settings the candidates' own chains do not carry (a grammar, a logit bias, penalties, DRY): they were
    silently dropped."""
    if not 1 <= candidates <= MAX_CANDIDATES:
        raise LocalpersError(f"candidates must be 1..{MAX_CANDIDATES}, got {candidates}", exit_code=2)
    if candidates <= 1 or sampling is None:
        return
    if not sampling.greedy:
        raise LocalpersError(
            "candidates need greedy decoding (temperature 0): they draw their own samples", exit_code=2
        )
    kept = [
        name
        for name, used in (
            ("a grammar", sampling.grammar is not None),
            ("a logit bias", bool(sampling.logit_bias)),
            ("repetition penalties", sampling.penalties),
            ("DRY", sampling.dry_multiplier > 0.0),
        )
        if used
    ]
    if kept:
        raise LocalpersError(
            f"candidates decode without {' or '.join(kept)}: ask for one candidate to use {'it' if len(kept) == 1 else 'them'}",
            exit_code=2,
        )


def decode_rewrite(
    engine: Engine,
    prompt: list[int],
    *,
    max_tokens: int,
    stop: Sequence[str],
    shared: int,
    sampling: SamplerSettings,
    correction: CardCorrection | None,
    new_correction: Callable[[], CardCorrection | None],
    candidates: int = 1,
    on_text: Callable[[str], None] | None = None,
) -> tuple[GenerationResult, CardCorrection | None]:
    """One rewrite's decode, and the correction that decoded it (its steps, for Why).

    One candidate: `generate` with `sampling` and `correction` in the chain, streamed to `on_text`. More:
    `decode_consensus`, each candidate with a fresh `new_correction()` and `sampling`'s word rule, the chosen
    text given to `on_text` once chosen, and an empty piece at each step before, which carries no text but lets
    the sink stop the decode by raising (every sink takes an empty piece so).
    """
    # The head's small products must not wake a multi-threaded BLAS that would fight llama.cpp's threads.
    with threadpool_limits(limits=1, user_api="blas"):
        if candidates > 1:
            result, correction = decode_consensus(
                engine,
                prompt,
                candidates,
                max_tokens,
                stop,
                shared,
                new_correction,
                repeated_word_penalty=sampling.word_penalty,
                # an empty piece carries no text: it lets the sink stop the decode (a client gone) at each step
                on_step=(lambda: on_text("")) if on_text else None,
                # `--seed` picks the candidates' draws (they ignored it); without one they stay the same each run
                seed=sampling.seed if sampling.seed is not None else 0,
            )
            if on_text:
                on_text(result.text)
            return result, correction
        result = generate(
            engine,
            prompt,
            max_tokens=max_tokens,
            sampling=sampling,
            stop=stop,
            method=correction,
            on_text=on_text,
            shared=shared,
        )
    return result, correction


def decode_consensus(
    engine: Engine,
    prompt: list[int],
    count: int,
    max_tokens: int,
    stop: Sequence[str],
    shared: int,
    new_correction: Callable[[], CardCorrection | None],
    repeated_word_penalty: float = 0.0,
    on_step: Callable[[], None] | None = None,
    seed: int = 0,
) -> tuple[GenerationResult, CardCorrection | None]:
    """The candidate the others agree with most, and the correction that decoded it (its steps, for Why).

    `repeated_word_penalty` puts the word-only repetition rule (`localpers.engine.repeated_words`) in every
    candidate's chain; `on_step` is called before each step and stops the decode by raising; candidate i draws
    with `seed + i`.
    """
    made: list[CardCorrection | None] = []

    def fresh() -> CardCorrection | None:
        made.append(new_correction())
        return made[-1]

    results = generate_candidates(
        engine,
        prompt,
        count=count,
        sampling=dataclasses.replace(candidate_sampling(count), repeated_word_penalty=repeated_word_penalty),
        method=fresh,
        max_tokens=max_tokens,
        stop=stop,
        shared=shared,
        on_step=on_step,
        seed=seed,
    )
    chosen = choose_consensus([r.text.strip() for r in results]).index
    return results[chosen], made[chosen]


def reference_tokens(engine: Engine, reference: str) -> list[int]:
    """`reference` as the tokens a one-line rewrite would emit for it (leading space, closing newline)."""
    return engine.tokenize(" " + reference.strip() + "\n", add_bos=False)


def score_references(
    engine: Engine,
    prompt: list[int],
    shared: int,
    reference: str,
    corrections: Sequence[CardCorrection | None],
) -> list[float]:
    """Mean per-token log-probability of `reference` under each correction; the model runs once for all."""
    with threadpool_limits(limits=1, user_api="blas"):
        scores = score_forced(engine, prompt, reference_tokens(engine, reference), corrections, shared)
    return [float(np.mean(column)) for column in scores]


def score_reference_run(
    engine: Engine, prompt: list[int], reference: str, correction: CardCorrection | None, shared: int
) -> GenerationResult:
    """`reference` forced through the decode loop `rewrite` uses, one step at a time (the gold likelihood)."""
    with threadpool_limits(limits=1, user_api="blas"):
        return generate(
            engine, prompt, method=correction, forced=reference_tokens(engine, reference), shared=shared
        )


def describe_steps(
    engine: Engine, result: GenerationResult, steps: Sequence[CorrectionRecord]
) -> list[RewriteStep]:
    """Each emitted token with the correction's candidates before and after it, best first (the Why view)."""
    described = []
    for token, record in zip(result.tokens, steps, strict=False):
        shifts = [
            CandidateShift(int(t), engine.detokenize([int(t)]), float(b), float(b + d))
            for t, b, d in zip(record.candidates, record.before, record.delta, strict=True)
        ]
        shifts.sort(key=lambda s: -s.after)
        match = [s.after - s.before for s in shifts if s.token == token]
        described.append(
            RewriteStep(int(token), engine.detokenize([token]), match[0] if match else 0.0, shifts)
        )
    return described
