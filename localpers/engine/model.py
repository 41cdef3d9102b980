"""The model side of the engine: a small typed API over llama.cpp's low-level bindings.

What it does: load a GGUF backbone (with the CPU buffer types `cpu_buffers` allows, applied by
`ggml_buffers`), create its context (with room for the batched sequences when asked) and its layer taps
(`taps`: a `cb_eval` tap on the `l_out-N` tensors), and free all of it again (`Engine.close`); say what a KV
state of this engine depends on (`state_fingerprint`, `kernels`).

`Engine` is assembled from base classes that each own one concern of the same context: `Vocabulary`
(`localpers.engine.vocabulary`: tokens <-> text, the chat template and the sampler chain over the vocabulary),
`Evaluation` (`localpers.engine.evaluation`: evaluating tokens into sequence 0 of the KV cache returning the
next-token logits together with the tapped layers' hidden states, truncation, the remembered prompt and shared
prefix, and teacher-forced scoring of continuations that share a prompt), `LoadedAdapters`
(`localpers.engine.loaded_adapters`: GGUF LoRA adapters, switched without reloading the backbone) and
`BatchedSequences` (`localpers.engine.batched_sequences`: `eval_sequences` and the sequences it evaluates). This
module creates every attribute they read, in `Engine.__init__` and `Engine._construct`; they create none.

What it does not do: stop rules, streaming and the generation loop live in `localpers.engine.generation`;
feature normalisation and the CARD head live elsewhere. Nothing here opens a network connection.

Shapes: logits are `(n_vocab,)` float32; features are `(n_taps, n_embd)` float32, the raw residual
stream after each tapped layer, at the position whose next token the logits predict.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import weakref
from collections.abc import Sequence
from pathlib import Path

from localpers.engine import cpu_buffers
from localpers.engine.backend import init_backend, raise_pending_interrupt, recorded_llama_log
from localpers.engine.batched_sequences import SEQUENCE_CELLS, BatchedSequences
from localpers.engine.context import CONTEXT_TOKENS, check_engine_sizes
from localpers.engine.ggml_buffers import BUFFER_SIZE_LINE, cpu_extra_buffer_types, only_extra_buffer_types
from localpers.engine.gguf_layout import check_gguf_file
from localpers.engine.llama import llama_cpp
from localpers.engine.loaded_adapters import LoadedAdapters
from localpers.engine.prefix_files import file_identity
from localpers.engine.prefix_snapshots import PrefixSnapshots
from localpers.engine.steps import Step
from localpers.engine.taps import MAX_TAPS, LayerTaps
from localpers.engine.threads import default_threads
from localpers.engine.vocabulary import Vocabulary
from localpers.errors import InputError, LocalpersError


def llama_cpp_version() -> str:
    return str(llama_cpp.__version__)


def llama_system_info() -> str:
    return llama_cpp.llama_print_system_info().decode("utf-8", errors="replace").strip()


class Engine(Vocabulary, LoadedAdapters, BatchedSequences):
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
