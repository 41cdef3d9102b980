"""Layer taps: the hidden states of chosen layers, copied out of llama.cpp while it decodes.

`LayerTaps` answers llama.cpp's `cb_eval` callback for the `l_out-N` tensors (the residual stream after
layer N) and copies them into numpy buffers, through the tiny C extension `localpers._taps` when it was
built and a pure-Python callback otherwise. `Engine` (`localpers.engine.model`) owns one per context and
reads it after each `llama_decode`; this module neither loads models nor decodes.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np

from localpers.engine.llama import _ggml, llama_cpp
from localpers.errors import LocalpersError

GGML_TYPE_F32 = 0
MAX_TAPS = 16  # the C extension's fixed table size (`lp_taps` in `_taps.c`)

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


class LayerTaps:
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
        state.stop_after = -1
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
        self._stop_after = -1
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
            return index != self._stop_after

        self.callback = llama_cpp.ggml_backend_sched_eval_callback(on_tensor)
        self.user_data = None

    def stop_after_deepest(self, enabled: bool) -> None:
        """Make llama.cpp skip every graph node after the deepest tap (or compute them all again).

        ggml stops computing a graph when the callback answers false for a node it watched. Only for a
        deepest tap on the model's last layer is what follows nothing but the output norm and the
        vocabulary projection (the caller checks): the logits of such a decode are then not computed.
        """
        value = len(self.names) - 1 if enabled else -1
        if self.implementation == "c":
            self._state.stop_after = value
        else:
            self._stop_after = value

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

    def collect(self, n_tokens: int, n_out: int, picked: Sequence[int] | None = None) -> np.ndarray:
        """Stack the tapped layers for the output rows: `(n_out, n_taps, n_embd)`.

        The output rows are the last `n_out` tokens, or the tokens at `picked` (in order, `n_out` of them).
        """
        per_layer = []
        for i, name in enumerate(self.names):
            filled = self._state.filled[i] if self.implementation == "c" else self._filled[i]
            if filled == 0:
                raise LocalpersError(
                    f"layer tap {name.decode()} produced nothing; is this a supported architecture?"
                )
            rows = self.buffers[i][: filled // 4].reshape(-1, self.n_embd)
            # llama.cpp keeps only the output rows in the final layer; earlier layers hold every token.
            if rows.shape[0] == n_tokens:
                rows = rows[-n_out:] if picked is None else rows[np.asarray(picked)]
            per_layer.append(rows)
        return np.stack(per_layer, axis=1)


class _CTapState(ctypes.Structure):
    """Mirror of `lp_taps` in `_taps.c`."""

    _fields_ = [
        ("get_name", ctypes.c_void_p),
        ("nbytes", ctypes.c_void_p),
        ("tensor_get", ctypes.c_void_p),
        ("n_taps", ctypes.c_int),
        ("error", ctypes.c_int),
        ("names", (ctypes.c_char * 64) * MAX_TAPS),
        ("buffers", ctypes.c_void_p * MAX_TAPS),
        ("capacity", ctypes.c_size_t * MAX_TAPS),
        ("filled", ctypes.c_size_t * MAX_TAPS),
        ("stop_after", ctypes.c_int),
    ]
