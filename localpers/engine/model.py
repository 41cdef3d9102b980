"""The model side of the engine: a small typed API over llama.cpp's low-level bindings.

What it does: load a GGUF backbone and GGUF LoRA adapters, switch the active adapter without
reloading the backbone, tokenize and detokenize, render a chat with the model's own template,
evaluate tokens into the KV cache returning the next-token logits together with the hidden states
of chosen layers (read through a `cb_eval` tap on the `l_out-N` tensors), teacher-forced scoring of
continuations that share a prompt, and hand out a sampler chain for this model's vocabulary
(`sampler_chain`, built in `localpers.engine.sampler_chain`).

What it does not do: stop rules, streaming and the generation loop live in `localpers.engine.generation`;
feature normalisation and the CARD head live elsewhere. Nothing here opens a network connection.

Shapes: logits are `(n_vocab,)` float32; features are `(n_taps, n_embd)` float32, the raw residual
stream after each tapped layer, at the position whose next token the logits predict.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import _ggml

from localpers.engine import cpu_buffers
from localpers.engine.backend import init_backend, recorded_llama_log
from localpers.engine.decoding import MethodSampler, SamplerSettings
from localpers.engine.sampler_chain import SamplerChain
from localpers.errors import LocalpersError

GGUF_MAGIC = b"GGUF"
GGML_TYPE_F32 = 0

_libggml = _ggml.libggml
_libggml.ggml_get_name.argtypes = [ctypes.c_void_p]
_libggml.ggml_get_name.restype = ctypes.c_char_p
_libggml.ggml_nbytes.argtypes = [ctypes.c_void_p]
_libggml.ggml_nbytes.restype = ctypes.c_size_t
_libggml.ggml_backend_tensor_get.argtypes = [
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_size_t,
]
_libggml.ggml_backend_tensor_get.restype = None


# ----------------------------------------------------------------- CPU extra buffer types
_GGML_BACKEND_DEVICE_TYPE_CPU = 0
_BUFFER_SIZE_LINE = re.compile(r"(\S+) model buffer size =\s*([0-9.]+) MiB")


def _bind(name: str, argtypes: list[Any], restype: Any) -> Any:
    function = getattr(_libggml, name)
    function.argtypes = argtypes
    function.restype = restype
    return function


# Bound once: ggml's device registry, the CPU device's proc-address lookup and buffer-type names.
_dev_by_type = _bind("ggml_backend_dev_by_type", [ctypes.c_int], ctypes.c_void_p)
_dev_backend_reg = _bind("ggml_backend_dev_backend_reg", [ctypes.c_void_p], ctypes.c_void_p)
_reg_proc_address = _bind(
    "ggml_backend_reg_get_proc_address", [ctypes.c_void_p, ctypes.c_char_p], ctypes.c_void_p
)
_buft_name = _bind("ggml_backend_buft_name", [ctypes.c_void_p], ctypes.c_char_p)


def _cpu_extra_buffer_array() -> ctypes.Array[ctypes.c_void_p] | None:
    """ggml's NULL-terminated list of the CPU device's extra buffer types (the array llama.cpp reads)."""
    device = _dev_by_type(_GGML_BACKEND_DEVICE_TYPE_CPU)
    if not device:
        return None
    address = _reg_proc_address(_dev_backend_reg(device), b"ggml_backend_dev_get_extra_bufts")
    if not address:
        return None
    get_extra = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(address)
    array_address = get_extra(device)
    if not array_address:
        return None
    length = 0
    while ctypes.c_void_p.from_address(array_address + length * ctypes.sizeof(ctypes.c_void_p)).value:
        length += 1
    return (ctypes.c_void_p * (length + 1)).from_address(array_address)


def _buffer_type_name(buffer_type: int) -> str:
    name = _buft_name(buffer_type)
    return (name or b"?").decode("utf-8", errors="replace")


def cpu_extra_buffer_types() -> list[str]:
    """Names of the extra CPU buffer types this llama.cpp build offers, in llama.cpp's order of preference."""
    init_backend()
    array = _cpu_extra_buffer_array()
    if array is None:
        return []
    return [_buffer_type_name(entry) for entry in array[:-1]]


@contextlib.contextmanager
def _only_extra_buffer_types(allowed: Sequence[str]) -> Iterator[None]:
    """While loading a model, llama.cpp sees only the `allowed` extra buffer types.

    llama.cpp has no per-type switch (only all or none through `use_extra_bufts`), and a per-tensor
    override to CPU_REPACK aborts on tensors repack cannot hold. So the CPU device's own list, which
    llama.cpp walks when it builds a model's buffer list, is compacted in place for the load and
    restored afterwards. The list is ggml's static array of pointers; entries are only removed, never
    added, so the array never grows.
    """
    array = _cpu_extra_buffer_array()
    if array is None:
        yield
        return
    original = list(array)
    kept = [entry for entry in original[:-1] if _buffer_type_name(entry) in allowed]
    for i in range(len(original)):
        array[i] = kept[i] if i < len(kept) else None
    try:
        yield
    finally:
        for i, entry in enumerate(original):
            array[i] = entry


def llama_cpp_version() -> str:
    return str(llama_cpp.__version__)


def llama_system_info() -> str:
    return llama_cpp.llama_print_system_info().decode("utf-8", errors="replace").strip()


def check_gguf_file(path: Path, what: str = "model") -> None:
    """Refuse a missing, empty or non-GGUF file with a one-line error before llama.cpp sees it."""
    if not path.is_file():
        raise LocalpersError(f"{what} file {path} does not exist")
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise LocalpersError(
            f"{what} file {path} is not a GGUF file (bad magic {magic!r}); give a .gguf file"
        )


@dataclass
class Step:
    """Result of evaluating tokens: next-token logits and layer features at the last position."""

    logits: np.ndarray
    features: np.ndarray | None


@dataclass
class ScoredContinuation:
    """Teacher-forced view of one continuation: per token, its log-prob and the features that predicted it."""

    tokens: list[int]
    logprobs: np.ndarray  # (T,), or the first `logprob_rows` of them
    features: np.ndarray | None  # (T, n_taps, n_embd)
    logits: np.ndarray | None = None  # (T, n_vocab) when asked for


class _Taps:
    """Captures the `l_out-N` tensors during `llama_decode`, through the C callback when it was built.

    `localpers._taps` (a tiny C extension, see `_taps.c`) answers llama.cpp's ~730 per-token node
    queries in nanoseconds; the pure-Python fallback works everywhere but costs microseconds per node.
    """

    def __init__(self, layers: Sequence[int], n_embd: int, max_tokens: int) -> None:
        self.names = [f"l_out-{layer}".encode() for layer in layers]
        self.n_embd = n_embd
        self.buffers = [np.zeros(max_tokens * n_embd, dtype=np.float32) for _ in layers]
        self.implementation = "c"
        try:
            self._setup_c()
        except (ImportError, OSError, AttributeError):
            self.implementation = "python"
            self._setup_python()

    def _setup_c(self) -> None:
        from localpers import _taps  # the compiled extension; ImportError when it was not built

        library = ctypes.CDLL(_taps.__file__)
        address = ctypes.cast(library.localpers_tap_callback, ctypes.c_void_p).value
        state = _CTapState()
        state.get_name = ctypes.cast(_libggml.ggml_get_name, ctypes.c_void_p).value
        state.nbytes = ctypes.cast(_libggml.ggml_nbytes, ctypes.c_void_p).value
        state.tensor_get = ctypes.cast(_libggml.ggml_backend_tensor_get, ctypes.c_void_p).value
        state.n_taps = len(self.names)
        for i, (name, buffer) in enumerate(zip(self.names, self.buffers, strict=True)):
            state.names[i].value = name
            state.buffers[i] = buffer.ctypes.data
            state.capacity[i] = buffer.nbytes
        self._library = library
        self._state = state
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(address)
        self.user_data = ctypes.cast(ctypes.pointer(state), ctypes.c_void_p)

    def _setup_python(self) -> None:
        wanted = {name: i for i, name in enumerate(self.names)}
        self._filled = [0] * len(self.names)
        self._error = 0
        get_name, nbytes_of, tensor_get = (
            _libggml.ggml_get_name,
            _libggml.ggml_nbytes,
            _libggml.ggml_backend_tensor_get,
        )

        def on_tensor(tensor: int, ask: bool, user_data: int) -> bool:
            index = wanted.get(get_name(tensor))
            if ask:
                return index is not None
            if index is None:
                return True
            if ctypes.c_int.from_address(tensor).value != GGML_TYPE_F32:
                self._error = 1
                return True
            size = nbytes_of(tensor)
            buffer = self.buffers[index]
            if self._filled[index] + size > buffer.nbytes:
                self._error = 2
                return True
            tensor_get(tensor, buffer.ctypes.data + self._filled[index], 0, size)
            self._filled[index] += size
            return True

        self.callback = llama_cpp.ggml_backend_sched_eval_callback(on_tensor)
        self.user_data = None

    def clear(self) -> None:
        if self.implementation == "c":
            self._state.error = 0
            for i in range(len(self.names)):
                self._state.filled[i] = 0
        else:
            self._error = 0
            self._filled = [0] * len(self.names)

    @property
    def error(self) -> str | None:
        code = self._state.error if self.implementation == "c" else self._error
        return {0: None, 1: "a tapped tensor is not f32", 2: "tap buffer too small"}.get(code, f"code {code}")

    def collect(self, n_tokens: int, n_out: int) -> np.ndarray:
        """Stack the tapped layers for the output rows: `(n_out, n_taps, n_embd)`."""
        per_layer = []
        for i, name in enumerate(self.names):
            filled = self._state.filled[i] if self.implementation == "c" else self._filled[i]
            if filled == 0:
                raise LocalpersError(
                    f"layer tap {name.decode()} produced nothing; is this a supported architecture?"
                )
            rows = self.buffers[i][: filled // 4].reshape(-1, self.n_embd)
            # llama.cpp keeps only the output rows in the final layer; earlier layers hold every token.
            per_layer.append(rows[-n_out:] if rows.shape[0] == n_tokens else rows)
        return np.stack(per_layer, axis=1)


class _CTapState(ctypes.Structure):
    """Mirror of `lp_taps` in `_taps.c`."""

    _fields_ = [
        ("get_name", ctypes.c_void_p),
        ("nbytes", ctypes.c_void_p),
        ("tensor_get", ctypes.c_void_p),
        ("n_taps", ctypes.c_int),
        ("error", ctypes.c_int),
        ("names", (ctypes.c_char * 64) * 16),
        ("buffers", ctypes.c_void_p * 16),
        ("capacity", ctypes.c_size_t * 16),
        ("filled", ctypes.c_size_t * 16),
    ]


class Engine:
    """One llama.cpp model + context, with optional layer taps and swappable LoRA adapters."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        n_ctx: int = 1024,
        n_threads: int | None = None,
        tap_layers: Sequence[int] | None = (-4, -3, -2, -1),
        n_batch: int = 512,
    ) -> None:
        init_backend()
        self.model_path = Path(model_path)
        check_gguf_file(self.model_path)
        self._model = None
        self.buffer_choice, self.weight_buffers = self._load_model()
        if not self._model:
            raise LocalpersError(f"llama.cpp could not load {self.model_path}: corrupt or unsupported GGUF")
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab: int = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.n_embd: int = int(llama_cpp.llama_model_n_embd(self._model))
        self.n_layer: int = int(llama_cpp.llama_model_n_layer(self._model))
        self.n_ctx = n_ctx
        self.n_threads = n_threads or max(1, os.cpu_count() or 1)
        self.tap_layers: tuple[int, ...] = tuple(
            sorted({layer % self.n_layer for layer in tap_layers}) if tap_layers else ()
        )
        if len(self.tap_layers) > 16:
            raise LocalpersError("at most 16 layers can be tapped")
        batch_size = min(n_batch, n_ctx)
        self._taps = _Taps(self.tap_layers, self.n_embd, batch_size) if self.tap_layers else None

        ctx_params = llama_cpp.llama_context_default_params()
        ctx_params.n_ctx = n_ctx
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
        self._ctx = llama_cpp.llama_init_from_model(self._model, ctx_params)
        if not self._ctx:
            llama_cpp.llama_model_free(self._model)
            self._model = None
            raise LocalpersError(
                f"llama.cpp could not create a context for {self.model_path} (n_ctx={n_ctx})"
            )
        self._batch = llama_cpp.llama_batch_init(ctx_params.n_batch, 0, 1)
        self._batch_capacity = int(ctx_params.n_batch)
        self._adapters: dict[str, ctypes.c_void_p] = {}
        self._adapter_paths: dict[str, Path] = {}
        self.active_adapter: str | None = None
        self.active_scale: float = 1.0
        self.n_past = 0
        # The last prefilled prompt and the step it produced: prefilling the same prompt again (CARD's fit
        # generates y- and then scores y+/y- after one prompt) truncates the cache to it instead of
        # re-evaluating it. Cleared by reset() and by truncating into it.
        self._prompt_memo: tuple[tuple[int, ...], Step] | None = None
        self._piece_cache: dict[int, bytes] = {}

    def _load_model(self) -> tuple[cpu_buffers.BufferChoice, dict[str, float]]:
        """Load the GGUF with the CPU buffer types `cpu_buffers` allows; returns the choice and MiB per type."""
        try:
            setting = cpu_buffers.setting_from_environment()
        except cpu_buffers.BufferSettingError as exc:
            raise LocalpersError(str(exc)) from None
        choice = cpu_buffers.choose_buffer_types(cpu_extra_buffer_types(), setting, cpu_buffers.cpu_flags())
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = 0
        model_params.use_extra_bufts = choice.use_extra_buffers
        with recorded_llama_log() as pieces, _only_extra_buffer_types(choice.allowed):
            self._model = llama_cpp.llama_model_load_from_file(str(self.model_path).encode(), model_params)
        log = "".join(pieces)
        sizes = {name: float(mib) for name, mib in _BUFFER_SIZE_LINE.findall(log)}
        return choice, sizes

    @property
    def tap_implementation(self) -> str | None:
        """`c` (compiled callback), `python` (fallback) or None when no layer is tapped."""
        return self._taps.implementation if self._taps is not None else None

    @property
    def tap_names(self) -> tuple[str, ...]:
        """llama.cpp graph names of the tapped tensors, in feature order (e.g. `l_out-14`)."""
        return tuple(f"l_out-{layer}" for layer in self.tap_layers)

    # ----------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Free the context, adapters and model. Safe to call twice."""
        if getattr(self, "_ctx", None):
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        for handle in getattr(self, "_adapters", {}).values():
            llama_cpp.llama_adapter_lora_free(handle)
        self._adapters = {}
        if getattr(self, "_model", None):
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Interpreter shutdown may have torn llama_cpp down already; nothing useful can be reported then.
        with contextlib.suppress(Exception):
            self.close()

    # ----------------------------------------------------------------- vocabulary
    @property
    def bos_token(self) -> int:
        return int(llama_cpp.llama_vocab_bos(self._vocab))

    @property
    def eos_token(self) -> int:
        return int(llama_cpp.llama_vocab_eos(self._vocab))

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of `text`; `add_bos` adds the model's BOS token if the model uses one.

        `special` parses control-token text such as `<start_of_turn>` into those tokens (for prompts
        rendered by `chat_prompt`); user text is never tokenized that way.
        """
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buffer = (llama_cpp.llama_token * capacity)()
        count = llama_cpp.llama_tokenize(self._vocab, data, len(data), buffer, capacity, add_bos, special)
        if count < 0:
            capacity = -count
            buffer = (llama_cpp.llama_token * capacity)()
            count = llama_cpp.llama_tokenize(self._vocab, data, len(data), buffer, capacity, add_bos, special)
        return list(buffer[:count])

    @property
    def has_chat_template(self) -> bool:
        """Whether the GGUF carries a chat template (base models such as Gemma 3 270M PT do not)."""
        return bool(llama_cpp.llama_model_chat_template(self._model, None))

    def chat_prompt(self, messages: Sequence[tuple[str, str]]) -> str:
        """`(role, content)` messages rendered with the model's chat template, ending where the reply starts."""
        template = llama_cpp.llama_model_chat_template(self._model, None)
        if not template:
            raise LocalpersError(f"{self.model_path.name} has no chat template; use a completion instead")
        encoded = [(role.encode("utf-8"), content.encode("utf-8")) for role, content in messages]
        chat = (llama_cpp.llama_chat_message * len(encoded))()
        for entry, (role, content) in zip(chat, encoded, strict=True):
            entry.role, entry.content = role, content
        capacity = 256 + 2 * sum(len(role) + len(content) for role, content in encoded)
        for _ in range(2):
            buffer = ctypes.create_string_buffer(capacity)
            size = llama_cpp.llama_chat_apply_template(template, chat, len(encoded), True, buffer, capacity)
            if size < 0:
                raise LocalpersError(
                    f"llama.cpp does not support the chat template of {self.model_path.name}"
                )
            if size <= capacity:
                return buffer.raw[:size].decode("utf-8", errors="replace")
            capacity = size
        raise LocalpersError("the chat template's output kept growing")

    def sampler_chain(
        self, settings: SamplerSettings, method: MethodSampler | None = None, *, final_pick: bool = True
    ) -> SamplerChain:
        """A llama.cpp sampler chain over this model's vocabulary (close it, or use it as a context manager)."""
        return SamplerChain(self._vocab, self.n_vocab, settings, method, final_pick=final_pick)

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes one token stands for (special tokens render as empty)."""
        cached = self._piece_cache.get(token)
        if cached is not None:
            return cached
        buffer = ctypes.create_string_buffer(64)
        size = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, 64, 0, False)
        if size < 0:
            buffer = ctypes.create_string_buffer(-size)
            size = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, -size, 0, False)
        piece = buffer.raw[:size]
        self._piece_cache[token] = piece
        return piece

    def detokenize(self, tokens: Sequence[int]) -> str:
        """Text of `tokens` (BOS/EOS and other control tokens are dropped)."""
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    # ----------------------------------------------------------------- adapters
    def load_adapter(self, path: str | Path, name: str | None = None) -> str:
        """Load a GGUF LoRA adapter (not yet active) and return the name it is known by."""
        adapter_path = Path(path)
        check_gguf_file(adapter_path, what="adapter")
        name = name or adapter_path.stem
        if name in self._adapters:
            raise LocalpersError(f"an adapter named {name!r} is already loaded")
        handle = llama_cpp.llama_adapter_lora_init(self._model, str(adapter_path).encode())
        if not handle:
            raise LocalpersError(
                f"llama.cpp refused adapter {adapter_path}: not a LoRA for this backbone"
                f" ({self.model_path.name}) or a corrupt file"
            )
        self._adapters[name] = handle
        self._adapter_paths[name] = adapter_path
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
        if name is None:
            result = llama_cpp.llama_set_adapters_lora(self._ctx, None, 0, None)
        else:
            handles = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(self._adapters[name])
            scales = (ctypes.c_float * 1)(scale)
            result = llama_cpp.llama_set_adapters_lora(self._ctx, handles, 1, scales)
        if result != 0:
            raise LocalpersError(f"llama.cpp could not activate adapter {name!r} (code {result})")
        self.active_adapter = name
        self.active_scale = scale
        self.reset()

    # ----------------------------------------------------------------- evaluation
    def reset(self) -> None:
        """Forget everything in the KV cache."""
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self._ctx), True)
        self.n_past = 0
        self._prompt_memo = None

    def truncate(self, n_keep: int) -> None:
        """Drop KV positions >= n_keep so evaluation continues from there (shared-prefix reuse)."""
        if n_keep >= self.n_past:
            return
        if n_keep <= 0:
            self.reset()
            return
        if self._prompt_memo is not None and n_keep < len(self._prompt_memo[0]):
            self._prompt_memo = None
        ok = llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self._ctx), 0, n_keep, -1)
        if not ok:
            raise LocalpersError("llama.cpp could not truncate the KV cache")
        self.n_past = n_keep

    def eval(
        self, tokens: Sequence[int], *, all_positions: bool = False, copy_logits: bool = True
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Append `tokens` to the KV cache.

        Returns `(logits, features)`: for the last position only, shapes `(n_vocab,)` and
        `(n_taps, n_embd)`, or with `all_positions` for every token, `(n, n_vocab)` and `(n, n_taps, n_embd)`.
        `copy_logits=False` (one batch only) returns a read-only view of llama.cpp's logits buffer instead of
        a copy: valid until the next evaluation, it saves the decode loop a 1 MB copy per token.
        """
        if not tokens:
            raise ValueError("eval needs at least one token")
        if self.n_past + len(tokens) > self.n_ctx:
            raise LocalpersError(
                f"text too long: {self.n_past + len(tokens)} tokens exceed the context of {self.n_ctx}"
            )
        logit_rows: list[np.ndarray] = []
        feature_rows: list[np.ndarray] = []
        for start in range(0, len(tokens), self._batch_capacity):
            chunk = tokens[start : start + self._batch_capacity]
            is_last_chunk = start + len(chunk) == len(tokens)
            n_out = self._decode(chunk, all_positions=all_positions, want_last=is_last_chunk)
            if n_out:
                logit_rows.append(self._read_logits(n_out, copy=copy_logits))
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

    def prefill(self, tokens: Sequence[int]) -> Step:
        """Evaluate a prompt from an empty cache; returns the step that predicts the first new token.

        When the cache still starts with exactly this prompt (the last one prefilled, same adapter), it is
        truncated back to it and the remembered step is returned instead: same result, no recomputation.
        """
        key = tuple(int(t) for t in tokens)
        memo = self._prompt_memo
        if memo is not None and memo[0] == key and self.n_past >= len(key):
            self.truncate(len(key))
            return Step(memo[1].logits.copy(), None if memo[1].features is None else memo[1].features.copy())
        self.reset()
        logits, features = self.eval(tokens)
        self._prompt_memo = (key, Step(logits.copy(), None if features is None else features.copy()))
        return Step(logits=logits, features=features)

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
        first = self.prefill(prompt_tokens)
        n_prompt = self.n_past
        results: list[ScoredContinuation] = []
        for continuation in continuations:
            cont = list(continuation)
            if not cont:
                raise ValueError("a continuation needs at least one token")
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
            logprobs = _log_softmax_at(all_logits[:rows], np.asarray(cont[:rows]))
            results.append(
                ScoredContinuation(
                    tokens=cont,
                    logprobs=logprobs,
                    features=np.concatenate(feature_rows, axis=0) if feature_rows else None,
                    logits=all_logits if keep_logits else None,
                )
            )
        return results

    # ----------------------------------------------------------------- internals
    def _decode(self, tokens: Sequence[int], *, all_positions: bool, want_last: bool) -> int:
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
        result = llama_cpp.llama_decode(self._ctx, batch)
        if result != 0:
            raise LocalpersError(f"llama.cpp decode failed (code {result}) at position {self.n_past}")
        if self._taps is not None and self._taps.error:
            raise LocalpersError(f"layer tap failed: {self._taps.error}")
        self.n_past += len(tokens)
        return n_out

    def _read_logits(self, n_out: int, *, copy: bool = True) -> np.ndarray:
        pointer = llama_cpp.llama_get_logits(self._ctx)
        rows = np.ctypeslib.as_array(pointer, shape=(n_out, self.n_vocab))
        if copy:
            return rows.copy()
        rows.flags.writeable = False
        return rows


def _log_softmax_at(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """log softmax(logits[t])[targets[t]] for every row t, in float64 for stability."""
    rows = logits.astype(np.float64)
    peak = rows.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(rows - peak).sum(axis=1)) + peak[:, 0]
    return rows[np.arange(len(targets)), targets] - log_norm
