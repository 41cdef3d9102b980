"""Device-side CARD: one object that owns the engine and the bundle, and rewrites for users.

A `Personalizer` holds one backbone engine with every adapter of the bundle loaded, the shared head
and the cluster centroids. Users are only `(cluster, vector)` pairs to it, so switching users never
reloads anything. It rewrites (CARD corrects the top-k logits inside llama.cpp's sampler chain) and scores
references teacher-forced through the same correction. What each decode is set up with (the user's cluster,
the method's adapter, CARD's correction sampler and the prompt) comes from its base class
`localpers.methods.card.decode_setup.DecodeSetup`. The fit of a user (pairs, lambda, token bias, the
per-user choice, written atomically to the user's folder) lives in `localpers.methods.card.user_fit`, which
works on this object; `fit_user`/`fit_items` here only call it. The preference pairs are built by `pairs`, the
correction itself by `correction`, prompts' tokens by `prompting`, and the decode itself (one candidate or
consensus), teacher-forced scoring and the Why view's steps by `decoding_runs`. It opens no network
connection.

Methods: `global` (global adapter), `cluster` (the user's cluster adapter), `card` (the bundle's base adapter +
reward-guided top-k correction with the user's vector; the base is the user's cluster adapter, or the global
adapter where the manifest's `head.base` says so), `card-global` (the correction on the global adapter, the
paper's "w/o LoRA" ablation), `global-history` (the global adapter with the user's history in the prompt).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from localpers import interrupts
from localpers.bundle.backbone_choice import backbone_for_bundle
from localpers.bundle.format import Bundle, open_bundle, reading_bundle, sha256_of_file
from localpers.engine import CONTEXT_TOKENS, Engine
from localpers.engine.backbone import Backbone
from localpers.engine.decoding import GREEDY, SamplerSettings
from localpers.engine.generation import GenerationResult
from localpers.engine.token_embeddings import TokenEmbeddings
from localpers.errors import LocalpersError
from localpers.methods.card import decoding_runs, prompting, user_fit
from localpers.methods.card.bundle_content import check_bundle_before_use
from localpers.methods.card.correction import CorrectionVariant
from localpers.methods.card.decode_setup import DecodeSetup
from localpers.methods.card.fitting import DEFAULT_PRIOR_WEIGHT, DEFAULT_REGULARISATION
from localpers.methods.card.head import CardHead
from localpers.methods.card.head_spec import HeadConfig
from localpers.methods.card.pairs import PairBuilder, Progress
from localpers.methods.card.recasing import FinishingStream
from localpers.methods.card.token_bias import TokenBias
from localpers.methods.card.user_fit import FitOutcome
from localpers.methods.consensus import MAX_CANDIDATES
from localpers.methods.reports import FitReport, RewriteResult
from localpers.tasks import get_task
from localpers.users.history import HistoryItem
from localpers.users.history_index import HistoryIndex
from localpers.users.history_prompt import PromptFormat
from localpers.users.store import User

# Batched sequences of the engine: the fit's pair pass uses 8 side by side (`localpers.engine.batch`), a
# rewrite's candidates up to all of them (`localpers.engine.candidates`).
BATCH_SEQUENCES = MAX_CANDIDATES


class Personalizer(DecodeSetup):
    """Backbone + bundle (adapters, head, centroids) ready to fit users and rewrite for them."""

    def __init__(
        self, bundle: Bundle, backbone: Backbone, *, n_ctx: int = CONTEXT_TOKENS, n_threads: int | None = None
    ) -> None:
        manifest = bundle.manifest
        if "head" not in manifest:
            raise LocalpersError(f"bundle {bundle.directory} has no head; it cannot personalize")
        self.bundle = bundle
        self.backbone = backbone
        self.bundle_sha256 = sha256_of_file(bundle.directory / "manifest.json")
        with reading_bundle(bundle):
            bundle.check_cluster_adapters()
            self.head_config = HeadConfig.from_manifest(manifest["head"])
            self.prompt_format = PromptFormat.from_manifest(
                manifest.get("prompt"), where=str(bundle.directory / "manifest.json")
            )
        self.engine = Engine(
            backbone.path,
            n_ctx=n_ctx,
            tap_layers=self.head_config.layers,
            n_threads=n_threads,
            batch_sequences=BATCH_SEQUENCES,
        )
        embeddings = TokenEmbeddings(backbone.path) if self.head_config.u == "factored" else None
        with reading_bundle(bundle):
            self.head_config.check_backbone(self.engine.n_layer)
            for name in bundle.adapter_names:
                self.engine.load_adapter(bundle.adapter_path(name), name)
            self.head = CardHead.load(bundle.head_path, self.head_config, embeddings)
        self._centroids: np.ndarray | None = None
        self.pairs = PairBuilder(
            self.engine, bundle, self.bundle_sha256, self.head, self.prompt_format, self.card_adapter
        )
        # Where an output ends: the model's end token and the one-line tasks' newline (closing habits apply there).
        self.end_tokens = sorted({self.engine.eos_token, *self.engine.tokenize("\n", add_bos=False)})

    @classmethod
    def open(
        cls, *, model: str | None = None, bundle: str | Path | None = None, n_threads: int | None = None
    ) -> Personalizer:
        """Resolve the backbone and the (verified) bundle, then load both. A bundle directory given here (no
        one may have signed it) has its content checked first, as `pull` checks what it installs; the pulled
        bundle on its first use (`check_bundle_before_use`)."""
        backbone = backbone_for_bundle(model, bundle)
        verified = open_bundle(bundle, backbone_sha256=backbone.sha256)
        check_bundle_before_use(verified, backbone.path, given=bundle is not None)
        return cls(verified, backbone, n_threads=n_threads)

    def close(self) -> None:
        self.engine.close()

    # ------------------------------------------------------------------ generation
    def rewrite(
        self,
        text: str,
        *,
        task: str = "headline",
        method: str = "card",
        cluster: int | None = None,
        vector: np.ndarray | None = None,
        strength: float | None = None,
        top_k: int | None = None,
        max_tokens: int | None = None,
        sampling: SamplerSettings | None = None,
        on_text: Callable[[str], None] | None = None,
        record_steps: bool = False,
        prompt_prefix: str = "",
        history: HistoryIndex | None = None,
        prompt_format: PromptFormat | None = None,
        prompt: list[int] | None = None,
        stop: Sequence[str] = (),
        bias: TokenBias | None = None,
        bias_strength: float | None = None,
        reference: str | None = None,
        candidates: int = 1,
        show_examples: bool = False,
        note: str = "",
    ) -> RewriteResult:
        """Generate for `text` with the chosen method; CARD corrects the top-k logits at every step.

        CARD's correction is the user vector's reward plus, when the user has one, their token bias
        (`bias`, times `bias_strength`, default DEFAULT_BIAS_STRENGTH), both on the same top-k candidates.
        With `reference`, the same prompt, adapter and correction then score that output teacher-forced
        (`gold_logprob`, the benchmark's gold likelihood; not counted in the timings).

        `history` (the user's examples) conditions the prompt when the bundle's adapters were trained with
        history prompts and the method is a personalized one; `global` always gets the plain prompt.
        `prompt_format` overrides the bundle's (the "same prompt, adapters not trained on it" ablation).
        `sampling` sets llama.cpp's sampler chain (default: greedy); CARD's correction is one sampler in it. The
        task's word-only repetition rule applies unless `sampling` sets `repeated_word_penalty` (0 = off) or
        `prompt` is given.
        `stop` adds stop strings to the task's. `prompt` (token ids, e.g. a chat from `chat_prompt_tokens`)
        replaces the task's template and its stop rule; `text` is then not used. A `text` longer than the task
        carries is cut to its start (headline, title) or refused (`Task.check_text`).
        `candidates` > 1 (greedy `sampling` only): that many outputs are decoded side by side, the greedy one
        and samples drawn as `decoding_runs.candidate_sampling` says (the method's correction in each), and
        the one that agrees most with the others is returned (`localpers.methods.consensus`); it is streamed
        once chosen.
        With `show_examples`, the result lists the history items the prompt showed (`history_prompt.ShownExample`).
        `note`: a line after the text in a plain prompt (EXACT's attributes; `Task.prompt_for`), never cut.
        """
        chosen_task = get_task(task)
        decoding_runs.check_candidates(candidates, sampling)
        # the task's word rule unless `sampling` sets one; a ready prompt (a chat) is no task's, so it is off
        # there. Teacher-forced scoring (`reference`) never uses it.
        sampling = (sampling or GREEDY).for_task(chosen_task.repeated_word_penalty if prompt is None else 0.0)
        adapter = self.adapter_for(method, cluster)
        correction, strength_used, k_used = self.correction_sampler(
            method, cluster, vector, strength, top_k, bias, bias_strength, record=record_steps
        )
        shared, chars_read, from_text = 0, None, prompt is None
        if prompt is None:
            chosen_task.check_text(text, room=len(note) + 1 if note else 0)
            prompt, shared, chars_read = self.prompt_tokens(
                chosen_task.name, text, method, history, prompt_format, prompt_prefix, note
            )
            stop = (*chosen_task.stop_strings, *stop)

        habits = bias if correction is not None and bias is not None and bias.has_text_habits else None
        stream = FinishingStream(habits.finish, text, on_text) if habits is not None and on_text else None
        self.engine.set_adapter(adapter)
        # the user's examples block, once evaluated, is kept in their folder for the next process
        kept_in = history.user_dir if history is not None and shared else None
        started = time.perf_counter()
        with self.engine.prefixes_kept_in(kept_in, history.write_lock if history is not None else None):
            result, correction = decoding_runs.decode_rewrite(
                self.engine,
                prompt,
                max_tokens=max_tokens or chosen_task.default_max_tokens,
                stop=stop,
                shared=shared,
                sampling=sampling,
                correction=correction,
                new_correction=lambda: self.correction_sampler(
                    method, cluster, vector, strength, top_k, bias, bias_strength, record=record_steps
                )[0],
                candidates=candidates,
                on_text=stream or on_text,
            )
        if stream is not None:
            stream.close()
        output = result.text if habits is None else habits.finish(result.text, text)
        total_ms = 1000 * (time.perf_counter() - started)
        steps = (
            decoding_runs.describe_steps(self.engine, result, correction.steps)
            if correction is not None and record_steps
            else []
        )
        gold: GenerationResult | None = None
        if reference is not None:
            scoring, _, _ = self.correction_sampler(
                method, cluster, vector, strength, top_k, bias, bias_strength
            )
            gold = decoding_runs.score_reference_run(self.engine, prompt, reference, scoring, shared)
        return RewriteResult(
            text=output.strip() if chosen_task.one_line else output,
            method=method,
            task=chosen_task.name,
            cluster=cluster,
            adapter=adapter,
            strength=strength_used,
            top_k=k_used,
            bias_strength=None if correction is None or correction.bias is None else correction.bias_strength,
            tokens=len(result.tokens),
            prompt_ms=round(1000 * result.prompt_seconds, 2),
            ms_per_token=round(result.ms_per_token, 3),
            total_ms=round(total_ms, 2),
            steps=steps,
            stop_reason=result.stop_reason,
            prompt_tokens=result.prompt_tokens,
            repeated_word_penalty=sampling.word_penalty,
            text_chars_read=chars_read,
            gold_logprob=None if gold is None else round(float(np.mean(gold.token_logprobs)), 5),
            gold_tokens=None if gold is None else len(gold.token_logprobs),
            examples=prompting.shown_in_prompt(
                chosen_task.name, text, self.format_for(method, prompt_format), history, chars_read
            )
            if show_examples and from_text
            else [],
        )

    def score_reference(
        self,
        text: str,
        reference: str,
        *,
        task: str = "headline",
        method: str = "card",
        cluster: int | None = None,
        vector: np.ndarray | None = None,
        strength: float | None = None,
        top_k: int | None = None,
        history: HistoryIndex | None = None,
        bias: TokenBias | None = None,
        bias_strength: float | None = None,
    ) -> float:
        """Mean per-token log-probability of `reference` after `text`'s prompt, as `rewrite` would decode it."""
        variant = CorrectionVariant(vector, strength, bias, bias_strength)
        return self.score_reference_variants(
            text,
            reference,
            [variant],
            task=task,
            method=method,
            cluster=cluster,
            top_k=top_k,
            history=history,
        )[0]

    def score_reference_variants(
        self,
        text: str,
        reference: str,
        variants: Sequence[CorrectionVariant],
        *,
        task: str = "headline",
        method: str = "card",
        cluster: int | None = None,
        top_k: int | None = None,
        history: HistoryIndex | None = None,
    ) -> list[float]:
        """`score_reference` for several corrections of one method at once: the model runs once for all."""
        chosen_task = get_task(task)
        self.engine.set_adapter(self.adapter_for(method, cluster))
        corrections = [
            self.correction_sampler(method, cluster, v.vector, v.strength, top_k, v.bias, v.bias_strength)[0]
            for v in variants
        ]
        prompt, shared, _ = self.prompt_tokens(chosen_task.name, text, method, history)
        return decoding_runs.score_references(self.engine, prompt, shared, reference, corrections)

    # ------------------------------------------------------------------ fitting (localpers.methods.card.user_fit)
    def fit_user(
        self,
        user: User,
        *,
        progress: Progress | None = None,
        regularisation: float = DEFAULT_REGULARISATION,
        history_limit: int | None = None,
        prior_weight: float = DEFAULT_PRIOR_WEIGHT,
        choose: bool = True,
    ) -> FitReport:
        """Fit `user` and store the result in its folder (`user_fit.fit_user`).

        A stop (Ctrl-C) after a pair cache could not be written is marked (`interrupts.mark_unsaved`), so the
        command does not say the pairs scored so far are saved.
        """
        self.pairs.cache_write_failed = False
        with interrupts.marking_unsaved(lambda: self.pairs.cache_write_failed):
            return user_fit.fit_user(
                self,
                user,
                progress=progress,
                regularisation=regularisation,
                history_limit=history_limit,
                prior_weight=prior_weight,
                choose=choose,
            )

    def fit_items(
        self,
        user: User,
        items: Sequence[HistoryItem],
        *,
        progress: Progress | None = None,
        regularisation: float = DEFAULT_REGULARISATION,
        prior_weight: float = DEFAULT_PRIOR_WEIGHT,
        history_offset: int = 0,
        cluster: int | None = None,
    ) -> FitOutcome:
        """The fit of `items`, stored nowhere (`user_fit.fit_items`; the per-user choice calls it)."""
        return user_fit.fit_items(
            self,
            user,
            items,
            progress=progress,
            regularisation=regularisation,
            prior_weight=prior_weight,
            history_offset=history_offset,
            cluster=cluster,
        )
