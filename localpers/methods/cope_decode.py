"""CoPe's decoding: the user model contrasted with its base model, one token at a time.

`CopeDecoder` holds two llama.cpp contexts of the same backbone, one for the user model (backbone + base adapter +
the user's LoRA, stacked into one adapter file, see `lora_files`) and one for the base model (backbone + base
adapter). The contrast is one sampler of the user model's llama.cpp sampler chain (`ContrastiveSampler`). At every
step, with `p_user` and `p_base` the two next-token distributions:

    V = {w : p_user(w) >= tau * max p_user}          (plausibility set)
    next token = argmax over V of  log p_user(w) - alpha * log p_base(w)

(tau = 0.1, alpha = 0.3 as in the CoPe paper). It costs a second forward pass per token. `rewrite_cope` is
`Personalizer.rewrite`'s counterpart for a user with a CoPe fit. Fitting and the stored state are
`localpers.methods.cope`; nothing here trains, writes user state or opens a network connection. Opening a
user's decoder writes their stacked adapter to a temporary file in their folder while llama.cpp loads it (0600;
one a killed process left is swept the next time the user's folder is locked: `atomic.remove_stale_temp_files_in`).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localpers.atomic import TEMP_SUFFIX
from localpers.engine import CONTEXT_TOKENS, Engine
from localpers.engine.context_bound import tokens_within_context
from localpers.engine.decoding import GREEDY, Candidates, SamplerSettings
from localpers.engine.generation import generate
from localpers.errors import InputError, LocalpersError
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.card.prompting import prompt_tokens, shown_in_prompt
from localpers.methods.cope import CopeState, adapter_path, load_state
from localpers.methods.lora_files import read_lora_gguf, write_stacked_lora
from localpers.methods.reports import RewriteResult
from localpers.methods.stored_files import fit_is_outdated, refit_advice
from localpers.tasks import get_task
from localpers.users.history_index import HistoryIndex
from localpers.users.history_prompt import PromptFormat
from localpers.users.store import User

DEFAULT_TAU = 0.1
DEFAULT_ALPHA = 0.3


@dataclass
class ContrastiveStep:
    """One decoding step: the plausible tokens and the one chosen (for tests and the Why view)."""

    plausible: np.ndarray
    chosen_by: np.ndarray  # the score of each plausible token, same order


class ContrastiveSampler:
    """CoPe's contrast as one sampler of llama.cpp's chain, keeping the base model in step with the user model.

    The base engine is prefilled with the same prompt on construction; the chain tells it each chosen token
    (`accept`), and `apply` evaluates those in the base model before scoring, so both models always see the
    same prefix. Of the candidates it gets (the whole vocabulary in the default chain), it keeps the
    plausibility set and gives each kept token `log p_user - alpha * log p_base`.
    """

    name = "cope"
    candidate_limit = None
    # its plausible tokens get log-probabilities, the others keep raw logits: no whole-vocabulary score means anything
    forced_scoring = False

    def __init__(
        self,
        base: Engine,
        prompt_tokens: Sequence[int],
        *,
        tau: float = DEFAULT_TAU,
        alpha: float = DEFAULT_ALPHA,
        record: bool = False,
    ) -> None:
        if not 0.0 < tau <= 1.0:
            raise LocalpersError(f"tau must be in (0, 1], got {tau}")
        if alpha < 0.0:
            raise LocalpersError(f"alpha must be >= 0, got {alpha}")
        self.base = base
        self.tau = tau
        self.alpha = alpha
        self.steps: list[ContrastiveStep] | None = [] if record else None
        self._base_logits = base.prefill(list(prompt_tokens)).logits
        self._pending: list[int] = []

    def accept(self, token: int) -> None:
        self._pending.append(token)

    def apply(self, candidates: Candidates, features: np.ndarray | None) -> None:
        for token in self._pending:
            self._base_logits = self.base.step(token).logits
        self._pending.clear()
        log_user = _log_softmax(candidates.logits)
        plausible = log_user >= log_user.max() + np.log(self.tau)
        ids = candidates.ids[plausible]
        scores = log_user[plausible]
        if self.alpha:
            scores = scores - self.alpha * _log_softmax(self._base_logits)[ids]
        candidates.keep(plausible)
        candidates.logits[:] = scores
        if self.steps is not None:
            self.steps.append(ContrastiveStep(ids.astype(np.int64), scores))


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    values = np.asarray(logits, dtype=np.float32)
    peak = values.max()
    return values - (peak + np.log(np.exp(values - peak).sum(dtype=np.float64))).astype(np.float32)


class CopeDecoder:
    """The user model and the base model in two contexts of the same backbone, ready to decode one user."""

    def __init__(
        self, backbone: Path, user_adapter: Path, base_adapter: Path | None, *, n_ctx: int = CONTEXT_TOKENS
    ) -> None:
        self.user = Engine(backbone, n_ctx=n_ctx, tap_layers=None)
        self.base = Engine(backbone, n_ctx=n_ctx, tap_layers=None)
        try:
            self.user.set_adapter(self.user.load_adapter(user_adapter, "user"))
            if base_adapter is not None:
                self.base.set_adapter(self.base.load_adapter(base_adapter, "base"))
        except BaseException:
            self.close()
            raise

    @classmethod
    def for_user(cls, personalizer: Personalizer, user: User, state: CopeState | None = None) -> CopeDecoder:
        """Stack the bundle's base adapter and the user's LoRA (in a temporary file in the user's folder) and load both."""
        state = state or load_state(user)
        refit = refit_advice("cope", user.name)
        if state.bundle_sha256 != personalizer.bundle_sha256:
            raise LocalpersError(f"user {user.name!r}'s CoPe adapter was fitted with another bundle; {refit}")
        if fit_is_outdated({"fitted_by": state.fitted_by}):
            raise LocalpersError(
                f"user {user.name!r}'s CoPe adapter was fitted by a localpers of another fit format, whose fits this"
                f" one does not read; {refit}"
            )
        base_path = personalizer.bundle.adapter_path(state.base_adapter)
        # named as atomic writes name their temp files (with this process's id), so a leftover is swept
        fd, temp_name = tempfile.mkstemp(
            dir=user.dir, prefix=f".cope-stacked.gguf.{os.getpid()}.", suffix=TEMP_SUFFIX
        )
        os.close(fd)
        stacked = Path(temp_name)
        try:
            own = adapter_path(user, state)
            base_lora, own_lora = read_lora_gguf(base_path), read_lora_gguf(own)
            try:
                write_stacked_lora(stacked, [base_lora, own_lora], private=True)
            except LocalpersError as exc:  # shapes that do not stack: the user's file is the one that changed
                raise InputError(f"{own} does not fit {base_path.name} ({exc}); {refit}") from None
            # llama.cpp copies the adapter's tensors when loading it, so the file can go right after.
            return cls(personalizer.backbone.path, stacked, base_path)
        finally:
            stacked.unlink(missing_ok=True)

    def close(self) -> None:
        self.user.close()
        self.base.close()

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int,
        stop: Sequence[str] = (),
        tau: float = DEFAULT_TAU,
        alpha: float = DEFAULT_ALPHA,
        on_text: Callable[[str], None] | None = None,
        record: bool = False,
        sampling: SamplerSettings | None = None,
    ) -> tuple[Any, ContrastiveSampler]:
        """Contrastive decoding (greedy unless `sampling` says otherwise) of a prompt (text or tokens);
        returns the result and the sampler."""
        tokens = self.user.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        started = time.perf_counter()
        contrast = ContrastiveSampler(self.base, tokens, tau=tau, alpha=alpha, record=record)
        base_prompt_seconds = time.perf_counter() - started
        result = generate(
            self.user,
            tokens,
            max_tokens=max_tokens,
            stop=stop,
            method=contrast,
            on_text=on_text,
            sampling=sampling,
        )
        result.prompt_seconds += base_prompt_seconds
        return result, contrast


def rewrite_cope(
    decoder: CopeDecoder,
    state: CopeState,
    text: str,
    *,
    task: str = "headline",
    tau: float = DEFAULT_TAU,
    alpha: float = DEFAULT_ALPHA,
    max_tokens: int | None = None,
    on_text: Callable[[str], None] | None = None,
    sampling: SamplerSettings | None = None,
    history: HistoryIndex | None = None,
    prompt_format: PromptFormat | None = None,
    show_examples: bool = False,
    stop: Sequence[str] = (),
    alone: bool = False,
) -> RewriteResult:
    """`Personalizer.rewrite`'s counterpart for CoPe (the `strength` field holds alpha).

    A fit trained on conditioned prompts (`state.conditioned`) decodes on `prompt_for_user(..., prompt_format,
    history)`, the bundle's format and the user's history index, as CARD's base adapter does; others on the plain
    task prompt. Both are tokenized as CARD's are (`prompting.prompt_tokens`: a headline of very dense text reads
    less of it). The task's word-only repetition rule applies unless `sampling` sets one (`Personalizer.rewrite`).
    With `show_examples`, the result lists the history items the prompt showed, as `Personalizer.rewrite`'s does.
    `stop` adds stop strings to the task's. With `alone` the text is the whole prompt, without examples and with no
    limit but the context's (a `free` text too long to carry beside them, `RewriteOptions.long_text_alone`).
    """
    chosen = get_task(task)
    if alone and chosen.name != "free":  # another task's template, stops and word rule would not apply to it
        raise ValueError(f"only a `free` text is given alone, not a {chosen.name!r} one")
    sampling = (sampling or GREEDY).for_task(chosen.repeated_word_penalty)
    started = time.perf_counter()
    used_format = prompt_format if state.conditioned and not alone else None
    if alone:
        prompt, chars_read = tokens_within_context(decoder.user, chosen.content(text)), None
    else:
        chosen.check_text(text)
        prompt, _, chars_read = prompt_tokens(decoder.user, chosen.name, text, used_format, history)
    result, _ = decoder.generate(
        prompt,
        max_tokens=max_tokens or chosen.default_max_tokens,
        stop=(*chosen.stop_strings, *stop),
        tau=tau,
        alpha=alpha,
        on_text=on_text,
        sampling=sampling,
    )
    return RewriteResult(
        text=result.text.strip() if chosen.one_line else result.text,
        method="cope",
        task=chosen.name,
        cluster=state.cluster,
        adapter=f"{state.base_adapter}+user",
        strength=alpha,
        top_k=None,
        tokens=len(result.tokens),
        prompt_ms=round(1000 * result.prompt_seconds, 2),
        ms_per_token=round(result.ms_per_token, 3),
        total_ms=round(1000 * (time.perf_counter() - started), 2),
        stop_reason=result.stop_reason,
        prompt_tokens=result.prompt_tokens,
        repeated_word_penalty=sampling.word_penalty,
        text_chars_read=chars_read,
        examples=shown_in_prompt(chosen.name, text, used_format, history, chars_read)
        if show_examples
        else [],
    )
