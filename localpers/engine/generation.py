"""The decode loop: prompt -> tokens through llama.cpp's sampler chain, with stop rules and streaming.

Each step's token is chosen by the engine's sampler chain (`localpers.engine.decoding.SamplerSettings`, greedy by
default); a personalization method plugs in as one sampler of that chain (`MethodSampler`: CARD's
correction, CoPe's contrast), which sees the step's candidates and tapped layer features. Stop strings
are honoured without ever streaming their text, and leading whitespace never triggers a stop (a
headline that starts with a newline is not an empty headline). This module does not load models.

`generate(..., forced=tokens)` runs the same method sampler teacher-forced: instead of choosing, it feeds
the given tokens and records each one's log-probability under the method's logits (the gold likelihood of
the benchmark). Since every input is known, the forced tokens are evaluated in one batch and the chain then
runs over each position's logits and features in order (batch-vs-single float noise only). The method
changes only the candidates it is given (CARD: the cluster model's top k); every other token keeps its
unchanged logit, so the correction moves the top k and the method is scored over the whole vocabulary. A method
whose new values are not on the logits' scale cannot be scored so, and says so (`forced_scoring = False`: CoPe,
whose plausible tokens get normalised log-probabilities beside the other tokens' raw logits); it is refused.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from localpers.engine import Engine
from localpers.engine.decoding import GREEDY, MethodSampler, SamplerSettings
from localpers.engine.steps import check_tokens

TextCallback = Callable[[str], None]


@dataclass
class GenerationResult:
    """What a generation produced and how long it took."""

    text: str
    tokens: list[int]
    stop_reason: str  # "eos", "stop", "length", or "context": the context was full
    prompt_tokens: int
    prompt_seconds: float
    decode_seconds: float
    chosen_logits: list[float] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)  # teacher-forced runs only

    @property
    def ms_per_token(self) -> float:
        return 1000.0 * self.decode_seconds / max(1, len(self.tokens))


class _StopScanner:
    """Tracks generated text, finds stop strings, and says how much text is safe to stream."""

    def __init__(self, stop: Sequence[str]) -> None:
        self.stop = [s for s in stop if s]
        self.streamed = 0

    def _content_start(self, text: str) -> int:
        return len(text) - len(text.lstrip())

    def find_stop(self, text: str) -> int | None:
        """Where the earliest stop string starts in `text`, or None.

        A stop of whitespace only (a one-line task's "\n") is looked for after the text's leading whitespace, so a
        newline the model opens with does not end it empty; any other stop is found from the first character (a
        chat reply that opens with the next turn's "\n\nUser:" is empty).
        """
        start = self._content_start(text)
        if start == len(text):
            return None
        hits = [index for s in self.stop if (index := text.find(s, start if s.isspace() else 0)) >= 0]
        return min(hits) if hits else None

    def safe_length(self, text: str) -> int:
        """Length of the prefix that cannot turn out to be part of a stop string."""
        held = 0
        for s in self.stop:
            for size in range(min(len(s), len(text)), 0, -1):
                if text.endswith(s[:size]):
                    held = max(held, size)
                    break
        return len(text) - held

    def emit(self, text: str, upto: int, on_text: TextCallback | None) -> None:
        if on_text is not None and upto > self.streamed:
            on_text(text[self.streamed : upto])
        self.streamed = max(self.streamed, upto)


def generate(
    engine: Engine,
    prompt: str | Sequence[int],
    *,
    max_tokens: int = 64,
    sampling: SamplerSettings | None = None,
    stop: Sequence[str] = (),
    method: MethodSampler | None = None,
    on_text: TextCallback | None = None,
    forced: Sequence[int] | None = None,
    shared: int = 0,
) -> GenerationResult:
    """Generate up to `max_tokens` tokens after `prompt`, streaming text pieces to `on_text`.

    With `forced`, feed exactly those tokens instead (no sampling, no stop rules) and return their
    log-probabilities under the method's distribution in `token_logprobs`.

    `chosen_logits` holds each chosen token's logit as the end of the chain saw it (after the method's
    change and, when sampling, the temperature).

    `shared`: the prompt's first tokens that other prompts share (`Engine.prefill`), kept in the cache.
    """
    if forced is not None:
        return _teacher_forced(engine, prompt, forced, method, shared)
    prompt_tokens = engine.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
    with engine.sampler_chain(sampling or GREEDY, method) as chain:
        started = time.perf_counter()
        step = engine.prefill(prompt_tokens, shared=shared)
        prompt_seconds = time.perf_counter() - started

        scanner = _StopScanner(stop)
        generated: list[int] = []
        chosen_logits: list[float] = []
        stop_reason = "length"
        text = ""
        decode_started = time.perf_counter()
        for _ in range(max_tokens):
            pick = chain.sample(step.logits, step.features)
            token = pick.token
            if engine.is_end_of_generation(token):
                stop_reason = "eos"
                break
            generated.append(token)
            chosen_logits.append(pick.logit)
            text = engine.detokenize(generated)
            cut = scanner.find_stop(text)
            if cut is not None:
                text = text[:cut]
                stop_reason = "stop"
                break
            scanner.emit(text, scanner.safe_length(text.rstrip("\ufffd")), on_text)
            if len(generated) == max_tokens:
                break
            if engine.n_past >= engine.n_ctx:
                stop_reason = "context"
                break
            step = engine.step(token, copy_logits=False)
        decode_seconds = time.perf_counter() - decode_started
    scanner.emit(text, len(text), on_text)
    return GenerationResult(
        text=text,
        tokens=generated,
        stop_reason=stop_reason,
        prompt_tokens=len(prompt_tokens),
        prompt_seconds=prompt_seconds,
        decode_seconds=decode_seconds,
        chosen_logits=chosen_logits,
    )


def _teacher_forced(
    engine: Engine,
    prompt: str | Sequence[int],
    forced: Sequence[int],
    method: MethodSampler | None,
    shared: int = 0,
) -> GenerationResult:
    """Feed `forced` and score each token: the method's candidates with its logits, the rest unchanged."""
    prompt_tokens = engine.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
    started = time.perf_counter()
    scored, prompt_seconds = _score_forced(engine, prompt_tokens, forced, [method], shared)
    return GenerationResult(
        text=engine.detokenize(list(forced)),
        tokens=[int(t) for t in forced],
        stop_reason="forced",
        prompt_tokens=len(prompt_tokens),
        prompt_seconds=prompt_seconds,
        decode_seconds=time.perf_counter() - started - prompt_seconds,
        token_logprobs=scored[0],
    )


def score_forced(
    engine: Engine,
    prompt: str | Sequence[int],
    forced: Sequence[int],
    methods: Sequence[MethodSampler | None],
    shared: int = 0,
) -> list[list[float]]:
    """Per-token log-probabilities of `forced` after `prompt` under each of `methods`, in one model pass.

    Each method scores exactly as `generate(..., forced=forced, method=method)` would (None: the model's
    own distribution); the model evaluates the prompt and the forced tokens once for all of them. Methods
    must be fresh (a method sampler counts the tokens it is told of).
    """
    prompt_tokens = engine.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
    return _score_forced(engine, prompt_tokens, forced, methods, shared)[0]


def _score_forced(
    engine: Engine,
    prompt_tokens: list[int],
    forced: Sequence[int],
    methods: Sequence[MethodSampler | None],
    shared: int = 0,
) -> tuple[list[list[float]], float]:
    """(log-probabilities per method, prompt seconds): the one teacher-forced scoring loop.

    A method changes only the candidates its chain leaves (CARD: the cluster model's top k and the user's
    habits); every other token keeps its unchanged logit. The normaliser is the unchanged one with the
    candidates' terms swapped for their new values, so each method costs its candidates, not the vocabulary.
    """
    check_tokens(engine, forced, "forced tokens")
    for method in methods:
        if method is not None and not getattr(method, "forced_scoring", True):
            raise ValueError(
                f"the {method.name} sampler's values are not logits: it cannot be scored teacher-forced"
            )
    with contextlib.ExitStack() as stack:
        chains = [
            None
            if method is None
            else stack.enter_context(engine.sampler_chain(GREEDY, method, final_pick=False))
            for method in methods
        ]
        started = time.perf_counter()
        first = engine.prefill(prompt_tokens, shared=shared)
        prompt_seconds = time.perf_counter() - started
        # Teacher-forced, every position's input is known: one batched pass gives all the rows a token-by-token
        # loop would (up to llama.cpp's batch-vs-single float noise) at a few times the speed.
        row_logits, row_features = [first.logits], [first.features]
        if len(forced) > 1:
            later_logits, later_features = engine.eval(list(forced[:-1]), all_positions=True)
            row_logits += list(later_logits)
            row_features += [None] * len(later_logits) if later_features is None else list(later_features)
        logprobs: list[list[float]] = [[] for _ in methods]
        for token, step_logits, step_features in zip(forced, row_logits, row_features, strict=True):
            logits = step_logits.astype(np.float64)
            top = float(logits.max())
            weights = np.exp(logits - top)
            total = float(weights.sum())
            for column, chain in zip(logprobs, chains, strict=True):
                if chain is None:
                    column.append(float(logits[token] - top - np.log(total)))
                    continue
                ids, changed = chain.transform(step_logits, step_features)
                finite = np.isfinite(changed)
                ids, changed = ids[finite], changed[finite].astype(np.float64)
                new_top = max(top, float(changed.max())) if len(changed) else top
                rest = max(total - float(weights[ids].sum()), 0.0) * np.exp(top - new_top)
                normaliser = new_top + np.log(rest + float(np.exp(changed - new_top).sum()))
                hit = np.flatnonzero(ids == token)
                value = float(changed[hit[0]]) if len(hit) else float(logits[token])
                column.append(value - normaliser)
                chain.accept(int(token))
    return logprobs, prompt_seconds
