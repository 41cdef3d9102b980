"""Several continuations of one prompt, decoded side by side: the greedy one and sampled ones.

The prompt is evaluated once, in sequence 0, exactly as `generate` would (the shared prefix and the prompt
memo apply); batched sequences 1..n then get its keys and values by reference and each continues with its own
llama.cpp sampler chain: candidate 0 greedy, candidate i sampled with the seed `seed + i`. Every step is one
llama_decode of one token per live candidate, which on a CPU costs a few single steps rather than n. A
method's sampler (CARD's correction) runs in each chain with that candidate's own tap features.

Stop rules are `generate`'s (end-of-generation token, stop strings, `max_tokens`, the context), each candidate
within an even part of the cache's cells; nothing is streamed. This module chooses nothing:
`localpers.methods.consensus` picks among the candidates.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from localpers.engine import Engine
from localpers.engine.decoding import GREEDY, MethodSampler, SamplerSettings
from localpers.engine.generation import GenerationResult, _StopScanner

MethodFactory = Callable[[], MethodSampler | None]


def generate_candidates(
    engine: Engine,
    prompt: Sequence[int],
    *,
    count: int,
    sampling: SamplerSettings,
    method: MethodFactory,
    max_tokens: int = 64,
    stop: Sequence[str] = (),
    shared: int = 0,
    seed: int = 0,
    on_step: Callable[[], None] | None = None,
) -> list[GenerationResult]:
    """`count` continuations of `prompt`: the greedy one first, then `count - 1` drawn with `sampling`.

    `method` makes a fresh method sampler per candidate (its state follows that candidate's tokens). `on_step` is
    called before each step of all candidates; what it raises stops the decode (a client that left, a draft
    that changed), as a streamed generation's text sink does.
    Timings: each result carries the shared prompt time and the whole batched decode time.
    """
    if not 1 <= count <= engine.batch_sequences:
        raise ValueError(f"count must be 1..{engine.batch_sequences} (the engine's batched sequences)")
    tokens = list(prompt)
    # Each candidate's own tokens take cells of the unified KV cache beside the prompt's, which they share: an
    # even part each, or 16 candidates of 1,024 tokens (which the API accepts) ran out of cells after minutes of
    # work and lost every candidate. Within it a candidate evaluates at most what sequence 0 could.
    evaluable = min(engine.n_ctx - len(tokens), (engine.cache_cells - len(tokens)) // count)
    started = time.perf_counter()
    first = engine.prefill(tokens, shared=shared)
    prompt_seconds = time.perf_counter() - started
    sequences = list(range(1, count + 1))
    # the greedy candidate keeps the word-only repetition rule of the others (`repeated_words`), if any
    greedy = replace(GREEDY, repeated_word_penalty=sampling.repeated_word_penalty)
    settings = [greedy] + [replace(sampling, seed=(seed + index) % 0xFFFFFFFE) for index in range(1, count)]
    generated: list[list[int]] = [[] for _ in sequences]
    logits_seen: list[list[float]] = [[] for _ in sequences]
    texts = [""] * count
    reasons = ["length"] * count
    scanners = [_StopScanner(stop) for _ in sequences]
    decode_started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        chains = [stack.enter_context(engine.sampler_chain(s, method())) for s in settings]
        for sequence in sequences:
            engine.forget_sequence(sequence)
            engine.branch_sequence(sequence, len(tokens))
        try:
            # max_tokens <= 0 asks for no token at all, as `generate` gives none
            rows = {index: (first.logits, first.features) for index in range(count)} if max_tokens > 0 else {}
            while rows:
                if on_step is not None:
                    on_step()
                live: list[int] = []
                for index, (logits, features) in rows.items():
                    pick = chains[index].sample(np.asarray(logits, dtype=np.float32), features)
                    if engine.is_end_of_generation(pick.token):
                        reasons[index] = "eos"
                        continue
                    generated[index].append(pick.token)
                    logits_seen[index].append(pick.logit)
                    text = engine.detokenize(generated[index])
                    cut = scanners[index].find_stop(text)
                    if cut is not None:
                        texts[index], reasons[index] = text[:cut], "stop"
                        continue
                    texts[index] = text
                    # As `generate`: max_tokens first, then the context (or the candidate's part of the cells) when
                    # the token just drawn could not be evaluated; the last token drawn needs no cell.
                    if len(generated[index]) >= max_tokens:
                        continue
                    if len(generated[index]) > evaluable:
                        reasons[index] = "context"
                    else:
                        live.append(index)
                if not live:
                    break
                logits, features = engine.eval_sequences(
                    [generated[i][-1] for i in live],
                    [len(tokens) + len(generated[i]) - 1 for i in live],
                    [sequences[i] for i in live],
                    all_outputs=True,
                )
                rows = {
                    index: (logits[row], None if features is None else features[row])
                    for row, index in enumerate(live)
                }
        finally:
            for sequence in sequences:
                engine.forget_sequence(sequence)
    decode_seconds = time.perf_counter() - decode_started
    return [
        GenerationResult(
            text=texts[i],
            tokens=generated[i],
            stop_reason=reasons[i],
            prompt_tokens=len(tokens),
            prompt_seconds=prompt_seconds,
            decode_seconds=decode_seconds,
            chosen_logits=logits_seen[i],
        )
        for i in range(count)
    ]
