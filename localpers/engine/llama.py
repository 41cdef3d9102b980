"""The one door to llama-cpp-python: `llama_cpp` and its `_ggml` bindings, loaded under the wait policy.

Every engine module that calls llama.cpp takes the bindings from here, so that importing any of them loads
llama_cpp (and with it libgomp) through `threads.load_llama_cpp`, which sets how OpenMP threads wait first.
Nothing else in localpers imports llama_cpp (`threads.load_llama_cpp` does it for this module), and nothing imports it before a command needs a model: the command
line's help, completion and user commands start without it (`tests/test_startup.py`).

It wraps no function: the typed API over these bindings is `model`, `evaluation`, `loaded_adapters`,
`batched_sequences`, `vocabulary`, `taps`, `sampler_chain`, `ggml_buffers`, `prefix_snapshots` and `backend`.
"""

from __future__ import annotations

from localpers.engine.threads import load_llama_cpp

load_llama_cpp()

# isort: split
import llama_cpp  # noqa: E402  (already loaded above, under the policy)
from llama_cpp import _ggml  # noqa: E402

__all__ = ["_ggml", "llama_cpp"]
