"""The model side of the engine: a small typed API over llama.cpp's low-level bindings.

What it does: load a GGUF backbone (with the CPU buffer types `cpu_buffers` allows, applied by
`ggml_buffers`) and GGUF LoRA adapters, switch the active adapter without reloading the backbone,
evaluate tokens into the KV cache returning the next-token logits together with the hidden states
of chosen layers (`taps`: a `cb_eval` tap on the `l_out-N` tensors), and teacher-forced scoring of
continuations that share a prompt. Tokens <-> text, the chat template and the sampler chain over the
vocabulary are `Engine`'s base class `Vocabulary` (`localpers.engine.vocabulary`).

What it does not do: stop rules, streaming and the generation loop live in `localpers.engine.generation`;
feature normalisation and the CARD head live elsewhere. Nothing here opens a network connection.

Shapes: logits are `(n_vocab,)` float32; features are `(n_taps, n_embd)` float32, the raw residual
stream after each tapped layer, at the position whose next token the logits predict.

What an evaluation returns (`Step`, `ScoredContinuation`) is `localpers.engine.steps`'s. The rest is one module of
some 630 lines because everything in it shares one KV cache: evaluation, truncation, the
remembered prompt, adapter switches (which clear it) and the batched sequences (`eval_sequences`) all keep the
same positions and `n_past` bookkeeping true, and a reader checking that should find it in one place.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from localpers.engine import cpu_buffers
from localpers.engine.backend import init_backend, raise_pending_interrupt, recorded_llama_log
from localpers.engine.context import CONTEXT_TOKENS, check_engine_sizes
from localpers.engine.ggml_buffers import BUFFER_SIZE_LINE, cpu_extra_buffer_types, only_extra_buffer_types
from localpers.engine.gguf_layout import check_gguf_file
from localpers.engine.llama import llama_cpp
from localpers.engine.prefix_files import KeptPrefix, PrefixStateFiles, file_identity
from localpers.engine.prefix_snapshots import PrefixSnapshots
from localpers.engine.steps import ScoredContinuation, Step, check_tokens, log_softmax_at
from localpers.engine.taps import MAX_TAPS, LayerTaps
from localpers.engine.threads import default_threads
from localpers.engine.vocabulary import Vocabulary
from localpers.errors import InputError, LocalpersError, TextTooLong

SEQUENCE_CELLS = 320  # KV positions of one batched sequence (a conditioned prompt + its continuation)


def llama_cpp_version() -> str:
    return str(llama_cpp.__version__)


def llama_system_info() -> str:
    return llama_cpp.llama_print_system_info().decode("utf-8", errors="replace").strip()


class Engine(Vocabulary):
    """One llama.cpp model + context, with optional layer taps and swappable LoRA adapters."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        n_ctx: int = CONTEXT_TOKENS,
        n_threads: int | None = None,
        tap_layers: Sequence[int] | None = (-4, -3, -2, -1),
        n_batch: int = 512,
        batch_sequences: int = 0,
    ) -> None:
        init_backend()
        check_engine_sizes(
            n_ctx=n_ctx,
            n_threads=n_threads,
            n_batch=n_batch,
            batch_sequences=batch_sequences,
            sequence_cells=SEQUENCE_CELLS,
        )
        self.model_path = Path(model_path)
        check_gguf_file(self.model_path)
        # what the kept prefix states are keyed on: the file as loaded, not as it may be replaced later
        self._model_identity = file_identity(self.model_path)
        self._model_handle: ctypes.c_void_p | None = None
        self._context: ctypes.c_void_p | None = None
        self._open_chains = weakref.WeakSet()
        try:
            self._construct(n_ctx, n_threads, tap_layers, n_batch, batch_sequences)
        except BaseException:
            self.close()  # a Ctrl-C or a refusal halfway: what was loaded so far is freed now, not kept
            raise

    def _construct(
        self,
        n_ctx: int,
        n_threads: int | None,
        tap_layers: Sequence[int] | None,
        n_batch: int,
        batch_sequences: int,
    ) -> None:
        self.buffer_choice, self.weight_buffers = self._load_model()
        if not self._model_handle:
            raise InputError(f"llama.cpp could not load {self.model_path}: corrupt or unsupported GGUF")
        self._vocab_handle = llama_cpp.llama_model_get_vocab(self._model_handle)
        self.n_vocab: int = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.n_embd: int = int(llama_cpp.llama_model_n_embd(self._model))
        self.n_layer: int = int(llama_cpp.llama_model_n_layer(self._model))
        self.n_ctx = n_ctx
        self.n_threads = n_threads or default_threads()
        outside = [layer for layer in tap_layers or () if not -self.n_layer <= layer < self.n_layer]
        if outside:  # `layer % n_layer` took 18 for layer 0 of an 18-layer model, silently
            raise LocalpersError(
                f"tap layer {outside[0]} does not exist: {self.model_path.name} has {self.n_layer} layers"
                f" (0..{self.n_layer - 1}, or -1..-{self.n_layer} from the last)"
            )
        self.tap_layers: tuple[int, ...] = tuple(
            sorted({layer % self.n_layer for layer in tap_layers}) if tap_layers else ()
        )
        if len(self.tap_layers) > MAX_TAPS:
            raise LocalpersError(f"at most {MAX_TAPS} layers can be tapped")
        batch_size = min(n_batch, n_ctx)
        self._taps = LayerTaps(self.tap_layers, self.n_embd, batch_size) if self.tap_layers else None

        ctx_params = llama_cpp.llama_context_default_params()
        ctx_params.n_ctx = n_ctx
        # Sequences 1..batch_sequences (`localpers.engine.batch`) share one KV cache with sequence 0, each
        # with up to SEQUENCE_CELLS positions; sequence 0 keeps its own n_ctx.
        self.batch_sequences = batch_sequences
        if batch_sequences:
            ctx_params.n_ctx = n_ctx + batch_sequences * SEQUENCE_CELLS
            ctx_params.n_seq_max = 1 + batch_sequences
            ctx_params.kv_unified = True
        ctx_params.n_batch = batch_size
        ctx_params.n_ubatch = batch_size
        ctx_params.n_threads = self.n_threads
        ctx_params.n_threads_batch = self.n_threads
        ctx_params.no_perf = True
        if hasattr(ctx_params, "swa_full"):
            ctx_params.swa_full = True  # keeps every position so the KV cache can be truncated anywhere
        if self._taps is not None:
            ctx_params.cb_eval = self._taps.callback
            ctx_params.cb_eval_user_data = self._taps.user_data
        self._context = llama_cpp.llama_init_from_model(self._model_handle, ctx_params) or None
        if not self._context:
            raise LocalpersError(
                f"llama.cpp could not create a context for {self.model_path} (n_ctx={n_ctx})"
            )
        raise_pending_interrupt()  # a Ctrl-C while llama.cpp logged the context's creation
        self._batch = llama_cpp.llama_batch_init(ctx_params.n_batch, 0, 1)
        self.prefix_snapshots = PrefixSnapshots(self._ctx)
        self._context_shape = {
            "n_ctx": int(ctx_params.n_ctx),
            "n_batch": int(ctx_params.n_batch),
            "n_seq_max": int(ctx_params.n_seq_max),
            "threads": self.n_threads,
        }
        self._state_fingerprint: str | None = None
        self.batch_capacity = int(ctx_params.n_batch)  # tokens one llama_decode (eval_sequences) takes
        self._adapters: dict[str, ctypes.c_void_p] = {}
        self._adapter_paths: dict[str, Path] = {}
        self._adapter_identities: dict[str, list[object]] = {}
        self.active_adapter: str | None = None
        self.active_scale: float = 1.0
        self.n_past = 0
        # The last prefilled prompt and the step it produced: prefilling the same prompt again (CARD's fit
        # generates y- and then scores y+/y- after one prompt) truncates the cache to it instead of
        # re-evaluating it. Cleared by reset() and by truncating into it.
        self._prompt_memo: tuple[tuple[tuple[int, ...], int], Step] | None = None
        # The tokens at positions 0.. of the cache that were evaluated as a batch of their own (prefill's
        # `shared`); cleared by reset() and by truncating into them.
        self._shared_prefix: tuple[int, ...] | None = None
        self._piece_cache: dict[int, bytes] = {}

    def _load_model(self) -> tuple[cpu_buffers.BufferChoice, dict[str, float]]:
        """Load the GGUF with the CPU buffer types `cpu_buffers` allows; returns the choice and MiB per type."""
        try:
            setting = cpu_buffers.setting_from_environment()
        except cpu_buffers.BufferSettingError as exc:
            raise InputError(str(exc)) from None  # a usage error (exit 2), as a bad LOCALPERS_MODEL is
        choice = cpu_buffers.choose_buffer_types(cpu_extra_buffer_types(), setting, cpu_buffers.cpu_flags())
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = 0
        model_params.use_extra_bufts = choice.use_extra_buffers
        with recorded_llama_log() as pieces, only_extra_buffer_types(choice.allowed):
            self._model_handle = llama_cpp.llama_model_load_from_file(
                os.fsencode(self.model_path), model_params
            )
        log = "".join(pieces)
        sizes = {name: float(mib) for name, mib in BUFFER_SIZE_LINE.findall(log)}
        return choice, sizes

    @property
    def cache_cells(self) -> int:
        """Cells of the KV cache: sequence 0's `n_ctx` and, with batched sequences, theirs (one unified cache)."""
        return int(self._context_shape["n_ctx"])

    @property
    def tap_implementation(self) -> str | None:
        """`c` (compiled callback), `python` (fallback) or None when no layer is tapped."""
        return self._taps.implementation if self._taps is not None else None

    @property
    def tap_names(self) -> tuple[str, ...]:
        """llama.cpp graph names of the tapped tensors, in feature order (e.g. `l_out-14`)."""
        return tuple(f"l_out-{layer}" for layer in self.tap_layers)

    # ----------------------------------------------------------------- lifecycle
    # The llama.cpp handles, refused once `close()` freed them: a freed handle aborts or crashes the process.
    @property
    def _model(self) -> ctypes.c_void_p:
        return self._open_handle(self._model_handle)

    @property
    def _vocab(self) -> ctypes.c_void_p:
        return self._open_handle(self._model_handle and self._vocab_handle)

    @property
    def _ctx(self) -> ctypes.c_void_p:
        return self._open_handle(self._context)

    def _open_handle(self, handle: ctypes.c_void_p | None) -> ctypes.c_void_p:
        if not handle:
            raise LocalpersError(f"the engine of {self.model_path.name} was closed; load the model again")
        return handle

    def close(self) -> None:
        """Free the context, adapters and model. Safe to call twice, and on an engine whose construction stopped.

        Every handle leaves the object before it is freed: a Ctrl-C during a free is raised as the free returns,
        and a handle still held then was freed again by `__del__` (a segfault). The frees after an interrupted one
        still run. The prompt memo goes too: a closed engine answered `prefill` and `score` from it."""
        context, self._context = getattr(self, "_context", None), None
        batch, self._batch = getattr(self, "_batch", None), None
        adapters, self._adapters = getattr(self, "_adapters", {}), {}
        self._adapter_paths, self._adapter_identities = {}, {}
        model, self._model_handle = getattr(self, "_model_handle", None), None
        self.n_past, self._prompt_memo, self._shared_prefix = 0, None, None
        snapshots = getattr(self, "prefix_snapshots", None)
        try:
            if hasattr(self, "_open_chains"):
                self.close_sampler_chains()
            if snapshots is not None:
                snapshots.clear()
            if batch is not None:
                llama_cpp.llama_batch_free(batch)
        finally:
            try:
                if context:
                    llama_cpp.llama_free(context)
            finally:
                try:
                    for handle in adapters.values():
                        llama_cpp.llama_adapter_lora_free(handle)
                finally:
                    if model:
                        llama_cpp.llama_model_free(model)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Interpreter shutdown may have torn llama_cpp down already; nothing useful can be reported then.
        with contextlib.suppress(Exception):
            self.close()

    # ----------------------------------------------------------------- adapters
    def load_adapter(self, path: str | Path, name: str | None = None) -> str:
        """Load a GGUF LoRA adapter (not yet active) and return the name it is known by."""
        adapter_path = Path(path)
        check_gguf_file(adapter_path, what="adapter")
        name = name or adapter_path.stem
        if name in self._adapters:
            raise LocalpersError(f"an adapter named {name!r} is already loaded")
        identity = file_identity(adapter_path)
        handle = llama_cpp.llama_adapter_lora_init(self._model, os.fsencode(adapter_path))
        raise_pending_interrupt()
        if not handle:
            raise InputError(
                f"llama.cpp refused adapter {adapter_path}: not a LoRA for this backbone"
                f" ({self.model_path.name}) or a corrupt file"
            )
        self._adapters[name] = handle
        self._adapter_paths[name] = adapter_path
        self._adapter_identities[name] = identity
        return name

    @property
    def adapters(self) -> dict[str, Path]:
        return dict(self._adapter_paths)

    def set_adapter(self, name: str | None, scale: float = 1.0) -> None:
        """Make `name` the only active adapter (None = plain backbone); clears the KV cache on a change."""
        if name == self.active_adapter and scale == self.active_scale:
            return
        if name is not None and name not in self._adapters:
            known = ", ".join(self._adapters) or "none"
            raise LocalpersError(f"no adapter named {name!r} is loaded (loaded: {known})")
        context = self._ctx
        try:
            if name is None:
                result = llama_cpp.llama_set_adapters_lora(context, None, 0, None)
            else:
                handles = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(self._adapters[name])
                scales = (ctypes.c_float * 1)(scale)
                result = llama_cpp.llama_set_adapters_lora(context, handles, 1, scales)
            if result != 0:
                raise LocalpersError(f"llama.cpp could not activate adapter {name!r} (code {result})")
        except BaseException:
            # A Ctrl-C is raised as the call returns, with the new adapter applied and `active_adapter` naming
            # the old one: the next set_adapter(old) returned early and outputs came from the wrong adapter.
            # Back to a state that is known: the plain backbone on an empty cache.
            llama_cpp.llama_set_adapters_lora(context, None, 0, None)
            self.active_adapter, self.active_scale = None, 1.0
            self.reset()
            raise
        self.active_adapter = name
        self.active_scale = scale
        self.reset()

    # ----------------------------------------------------------------- evaluation
    def reset(self) -> None:
        """Forget everything in the KV cache."""
        memory = llama_cpp.llama_get_memory(self._ctx)
        # first: a Ctrl-C is raised as the clear returns, and a memo kept then matched a prompt the cache had lost
        self.n_past, self._prompt_memo, self._shared_prefix = 0, None, None
        llama_cpp.llama_memory_clear(memory, True)

    def truncate(self, n_keep: int) -> None:
        """Drop KV positions >= n_keep so evaluation continues from there (shared-prefix reuse)."""
        if n_keep >= self.n_past:
            return
        if n_keep <= 0:
            self.reset()
            return
        if self._prompt_memo is not None and n_keep < len(self._prompt_memo[0][0]):
            self._prompt_memo = None
        if self._shared_prefix is not None and n_keep < len(self._shared_prefix):
            self._shared_prefix = None
        memory = llama_cpp.llama_get_memory(self._ctx)
        self.n_past = n_keep  # first: a Ctrl-C is raised as the removal returns, the positions already gone
        if not llama_cpp.llama_memory_seq_rm(memory, 0, n_keep, -1):
            self.reset()  # what the cache still holds is not known
            raise LocalpersError("llama.cpp could not truncate the KV cache")

    def eval(
        self, tokens: Sequence[int], *, all_positions: bool = False, copy_logits: bool = True
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Append `tokens` to the KV cache.

        Returns `(logits, features)`: for the last position only, shapes `(n_vocab,)` and
        `(n_taps, n_embd)`, or with `all_positions` for every token, `(n, n_vocab)` and `(n, n_taps, n_embd)`.
        `copy_logits=False` returns a read-only view of llama.cpp's logits buffer instead of a copy when the tokens
        fit one batch (over several with `all_positions`, a new array): valid until the next evaluation, it saves
        the decode loop a 1 MB copy per token.
        """
        check_tokens(self, tokens, "eval's tokens")
        if self.n_past + len(tokens) > self.n_ctx:
            raise TextTooLong(
                f"text too long: {self.n_past + len(tokens)} tokens exceed the model's context of"
                f" {self.n_ctx}; shorten the text (or the history items it is shown with)"
            )
        logit_rows: list[np.ndarray] = []
        feature_rows: list[np.ndarray] = []
        for start in range(0, len(tokens), self.batch_capacity):
            chunk = tokens[start : start + self.batch_capacity]
            is_last_chunk = start + len(chunk) == len(tokens)
            n_out = self._decode(chunk, all_positions=all_positions, want_last=is_last_chunk)
            if n_out:
                # a view of an earlier batch's rows would be overwritten by the next batch: copy those
                logit_rows.append(self._read_logits(n_out, copy=copy_logits or not is_last_chunk))
                if self._taps is not None:
                    feature_rows.append(self._taps.collect(len(chunk), n_out))
        logits = logit_rows[0] if len(logit_rows) == 1 else np.concatenate(logit_rows, axis=0)
        features = np.concatenate(feature_rows, axis=0) if feature_rows else None
        if all_positions:
            return logits, features
        return logits[-1], (features[-1] if features is not None else None)

    def step(self, token: int, *, copy_logits: bool = True) -> Step:
        """Evaluate one token; the logits array is a copy the caller may modify (a view without `copy_logits`)."""
        logits, features = self.eval([token], copy_logits=copy_logits)
        return Step(logits=logits, features=features)

    def prefill(self, tokens: Sequence[int], *, shared: int = 0) -> Step:
        """Evaluate a prompt from an empty cache; returns the step that predicts the first new token.

        `shared` > 0 says the first `shared` tokens are a prefix many prompts start with (a user's recent
        examples): they are always evaluated as a batch of their own, and when the cache already holds exactly
        them (same adapter) only the rest is evaluated; after an adapter switch the prefix's keys and values
        come back from `prefix_snapshots`. Cold or warm, a prompt gives the same numbers, since llama.cpp's
        results depend on how a prompt is split into batches (docs/PERFORMANCE.md).
        When the cache still starts with exactly this prompt (the last one prefilled, same adapter), it is
        truncated back to it and the remembered step is returned instead: same result, no recomputation.
        """
        key = tuple(int(t) for t in tokens)
        shared = shared if 0 < shared < len(key) else 0
        memo = self._prompt_memo
        if memo is not None and memo[0] == (key, shared) and self.n_past >= len(key):
            self.truncate(len(key))
            return Step(memo[1].logits.copy(), None if memo[1].features is None else memo[1].features.copy())
        prefix = key[:shared]
        if shared and self._shared_prefix == prefix and self.n_past >= shared:
            self.truncate(shared)
            self._prompt_memo = None
        else:
            self.reset()
            if shared:
                stored_as = self._prefix_file(prefix)
                if self.prefix_snapshots.restore(self.active_adapter, self.active_scale, prefix, stored_as):
                    self.n_past = shared
                else:
                    self.eval(prefix, copy_logits=False)
                    self.prefix_snapshots.save(self.active_adapter, self.active_scale, prefix, stored_as)
                self._shared_prefix = prefix
        logits, features = self.eval(key[shared:])
        self._prompt_memo = (
            (key, shared),
            Step(logits.copy(), None if features is None else features.copy()),
        )
        return Step(logits=logits, features=features)

    @property
    def state_fingerprint(self) -> str:
        """What a KV state of this engine depends on besides the adapter and the tokens: the backbone file,
        llama.cpp's version and CPU features, the buffer types and the context's shape (`prefix_files`)."""
        if self._state_fingerprint is None:
            self._state_fingerprint = json.dumps(
                {"model": self._model_identity, **self.kernels, "context": self._context_shape},
                sort_keys=True,
            )
        return self._state_fingerprint

    @property
    def kernels(self) -> dict[str, object]:
        """What picks llama.cpp's kernels, and with them the float rounding of every result (a greedy output
        may change with them): its version, the CPU features it uses and the buffer types allowed."""
        return {
            "llama_cpp": llama_cpp_version(),
            "system": llama_system_info(),
            "buffers": list(self.buffer_choice.allowed),
        }

    @contextlib.contextmanager
    def prefixes_kept_in(
        self, folder: Path | None, lock: Callable[[], contextlib.AbstractContextManager[None]] | None = None
    ) -> Iterator[None]:
        """While open, shared prefixes are also kept in and read from `folder` (`PrefixStateFiles`, each write
        under `lock`; None: in memory only), so the next process that prefills the same prefix restores it
        instead of evaluating it."""
        before = self.prefix_snapshots.files
        fingerprint = self.state_fingerprint if folder is not None else ""
        self.prefix_snapshots.files = None if folder is None else PrefixStateFiles(folder, fingerprint, lock)
        try:
            yield
            self.prefix_snapshots.write_kept()  # after the block: the output never waits for the disk
        finally:
            self.prefix_snapshots.clear_unwritten()
            self.prefix_snapshots.files = before

    def _prefix_file(self, prefix: tuple[int, ...]) -> KeptPrefix | None:
        files = self.prefix_snapshots.files
        if files is None:
            return None
        adapter = None if self.active_adapter is None else self._adapter_identities[self.active_adapter]
        return files.entry_for(adapter, self.active_scale, prefix)

    def score(
        self,
        prompt_tokens: Sequence[int],
        continuations: Sequence[Sequence[int]],
        *,
        keep_logits: bool = False,
        logprob_rows: int | None = None,
    ) -> list[ScoredContinuation]:
        """Teacher-forced log-probs and features of each continuation after the same prompt.

        The prompt is evaluated once; each continuation reuses its KV cache entries.
        Row t of a result belongs to continuation token t and holds what the model saw
        before choosing it. `logprob_rows` limits the log-probabilities to the first rows (a full-vocabulary
        softmax per token is a large share of the cost when only the features are wanted).
        """
        if logprob_rows is not None and logprob_rows < 1:
            raise ValueError(f"logprob_rows must be at least 1 (or None for every row), not {logprob_rows}")
        first = self.prefill(prompt_tokens)
        n_prompt = self.n_past
        results: list[ScoredContinuation] = []
        for continuation in continuations:
            cont = list(continuation)
            check_tokens(self, cont, "a continuation")
            self.truncate(n_prompt)
            logits_rows = [first.logits[None, :]]
            feature_rows = [first.features[None]] if first.features is not None else []
            if len(cont) > 1:
                logits, features = self.eval(cont[:-1], all_positions=True)
                logits_rows.append(logits)
                if features is not None:
                    feature_rows.append(features)
            all_logits = np.concatenate(logits_rows, axis=0)
            rows = len(cont) if logprob_rows is None else min(logprob_rows, len(cont))
            logprobs = log_softmax_at(all_logits[:rows], np.asarray(cont[:rows]))
            results.append(
                ScoredContinuation(
                    tokens=cont,
                    logprobs=logprobs,
                    features=np.concatenate(feature_rows, axis=0) if feature_rows else None,
                    logits=all_logits if keep_logits else None,
                )
            )
        return results

    def eval_sequences(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        sequences: Sequence[int],
        *,
        all_outputs: bool = False,
        outputs: Sequence[bool] | None = None,
        logits: bool = True,
    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """One llama_decode of tokens at given positions of given sequences (1..batch_sequences).

        Returns the logits (a read-only view, valid until the next evaluation) and tap features of every
        token with `all_outputs`, of the tokens marked True in `outputs` (in order), else of the last token only.
        Sequence 0 and `n_past` are not touched.
        `logits=False` (features only) skips the vocabulary projection when the deepest tap is the model's
        last layer, about half of a multi-token pass on Gemma 3's 262k vocabulary, and returns None for them.
        """
        if not 0 < len(tokens) <= self.batch_capacity:
            raise ValueError(f"eval_sequences takes 1 to {self.batch_capacity} tokens")
        wanted = _output_mask(len(tokens), all_outputs, outputs)
        context = self._ctx  # refused once closed, before the (then freed) batch is touched
        batch = self._batch
        for i, (token, position, sequence) in enumerate(zip(tokens, positions, sequences, strict=True)):
            if not 0 < sequence <= self.batch_sequences or position >= self.n_ctx + SEQUENCE_CELLS:
                raise LocalpersError(f"batched sequence {sequence} position {position} is out of range")
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, position, 1
            batch.seq_id[i][0] = sequence
            batch.logits[i] = wanted[i]
        batch.n_tokens = len(tokens)
        skip_logits = not logits and self._taps is not None and self.tap_layers[-1] == self.n_layer - 1
        if self._taps is not None:
            self._taps.clear()
            self._taps.stop_after_deepest(skip_logits)
        try:
            result = llama_cpp.llama_decode(context, batch)
            raise_pending_interrupt()  # as in `_decode`
            if result != 0:
                raise LocalpersError("llama.cpp decode of a batch of sequences failed")
        finally:
            if skip_logits:
                self._taps.stop_after_deepest(False)
        if self._taps is not None and self._taps.error:
            raise LocalpersError(f"layer tap failed: {self._taps.error}")
        picked = [i for i, wants in enumerate(wanted) if wants]
        features = None
        if self._taps is not None:
            features = self._taps.collect(len(tokens), len(picked), None if outputs is None else picked)
        return (None if skip_logits else self._read_logits(len(picked), copy=False)), features

    def forget_sequence(self, sequence: int, start: int = 0) -> None:
        """Drop positions >= `start` of a batched sequence from the KV cache."""
        if not 0 < sequence <= self.batch_sequences:
            raise ValueError(f"sequence {sequence} is not a batched sequence")
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self._ctx), sequence, start, -1)

    def share_sequence(self, source: int, target: int, length: int) -> None:
        """Give batched sequence `target` the cache entries of `source`'s positions 0..length-1 (no copy).

        The KV cache is unified, so the cells simply belong to both sequences: what `target` evaluates next
        attends to exactly the keys and values `source` computed.
        """
        for sequence in (source, target):
            if not 0 < sequence <= self.batch_sequences:
                raise ValueError(f"sequence {sequence} is not a batched sequence")
        llama_cpp.llama_memory_seq_cp(llama_cpp.llama_get_memory(self._ctx), source, target, 0, length)

    def branch_sequence(self, target: int, length: int) -> None:
        """Give batched sequence `target` sequence 0's cache entries of positions 0..length-1 (no copy).

        `target` then continues the prompt sequence 0 holds (`localpers.engine.candidates`); sequence 0 is
        left as it was.
        """
        if not 0 < target <= self.batch_sequences:
            raise ValueError(f"sequence {target} is not a batched sequence")
        if length > self.n_past:
            raise ValueError(f"sequence 0 holds {self.n_past} positions, not {length}")
        llama_cpp.llama_memory_seq_cp(llama_cpp.llama_get_memory(self._ctx), 0, target, 0, length)

    # ----------------------------------------------------------------- internals
    def _decode(self, tokens: Sequence[int], *, all_positions: bool, want_last: bool) -> int:
        context = self._ctx  # refused once closed, before the (then freed) batch is touched
        batch = self._batch
        n_out = 0
        for i, token in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = self.n_past + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            wants = all_positions or (want_last and i == len(tokens) - 1)
            batch.logits[i] = wants
            n_out += wants
        batch.n_tokens = len(tokens)
        if self._taps is not None:
            self._taps.clear()
        start = self.n_past
        try:
            result = llama_cpp.llama_decode(context, batch)
            # a Ctrl-C the Python tap callback swallowed (ctypes reports it and answers 0, which stops the graph):
            # raised here, not taken for an empty tap or returned with stale logits
            raise_pending_interrupt()
            if result != 0:
                raise LocalpersError(f"llama.cpp decode failed (code {result}) at position {start}")
            self.n_past = start + len(tokens)
            if self._taps is not None and self._taps.error:
                raise LocalpersError(f"layer tap failed: {self._taps.error}")
        except BaseException:
            # A Ctrl-C during the C call is raised only after it returned, when the cache already holds the
            # batch; a failed tap leaves it there too. Drop it, or n_past and the cache disagree and the next
            # prefill of the same prompt collides with those cells.
            self.n_past = start
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self._ctx), 0, start, -1)
            raise
        return n_out

    def _read_logits(self, n_out: int, *, copy: bool = True) -> np.ndarray:
        pointer = llama_cpp.llama_get_logits(self._ctx)
        rows = np.ctypeslib.as_array(pointer, shape=(n_out, self.n_vocab))
        if copy:
            return rows.copy()
        rows.flags.writeable = False
        return rows


def _output_mask(n_tokens: int, all_outputs: bool, outputs: Sequence[bool] | None) -> list[bool]:
    """Which tokens of an `eval_sequences` batch return logits and features: all, the marked ones, or the last."""
    if outputs is None:
        return [all_outputs or i == n_tokens - 1 for i in range(n_tokens)]
    if all_outputs:
        raise ValueError("eval_sequences takes all_outputs or outputs, not both")
    wanted = [bool(wants) for wants in outputs]
    if len(wanted) != n_tokens or not any(wanted):
        raise ValueError("outputs marks one flag per token, at least one of them True")
    return wanted
