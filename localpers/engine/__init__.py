"""Running models on this machine: llama.cpp (loaded only through `llama`, which imports `llama_cpp` by way of
`threads.load_llama_cpp`), the encoder, torch.

- `model`, `evaluation`, `loaded_adapters`, `batched_sequences`, `steps`, `vocabulary`, `taps`, `ggml_buffers`,
  `sampler_chain`, `backend`: the llama.cpp model (`Engine`: loading, the context, closing), its evaluation and
  scoring in sequence 0 of the KV cache, its LoRA adapters, its batched sequences, what an evaluation returns, its
  tokens and chat template, its layer taps, the weights' CPU buffer types, and its sampler chain; everything else
  in localpers reaches llama.cpp through these and the names re-exported here.
- `llama`: loads `llama_cpp` under `threads`' wait policy; `context`: the tokens a generation can hold.
- `decoding`, `generation`: what a decoding step should do (settings, a method's sampler) and the decode loop;
  `batch`, `candidates`: prompts evaluated side by side, and sampled candidates; `repeated_words`: the word-only
  repetition rule; `prefix_snapshots`, `prefix_files`: a prompt's evaluated start kept in memory and on disk.
- `backbone`, `cpu_buffers`, `token_embeddings`, `adapters`, `gguf_layout`, `lora_targets`: the backbone GGUF, its
  weight layouts, its token embeddings, LoRA adapter files, a GGUF's tensor layout (and the check that a file is
  a GGUF at all), the layers LoRA adapts.
- `encoder`, `minilm`: the numpy sentence encoder. `torch_model`: the backbone in torch, for training only.
- `threads`: how many threads llama.cpp runs, and the wait policy `llama` loads it under.

Importing the package loads nothing: each name below is taken from its module on first use, so that a command
that never runs a model (help, completion, `user list`) does not pay for llama.cpp and numpy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localpers.engine.backend import init_backend
    from localpers.engine.context import CONTEXT_TOKENS
    from localpers.engine.ggml_buffers import cpu_extra_buffer_types
    from localpers.engine.ggml_buffers import only_extra_buffer_types as _only_extra_buffer_types
    from localpers.engine.gguf_layout import GGUF_MAGIC, check_gguf_file
    from localpers.engine.model import Engine, llama_cpp_version, llama_system_info
    from localpers.engine.sampler_chain import Pick, SamplerChain
    from localpers.engine.steps import ScoredContinuation, Step

_EXPORTED_FROM = {
    "CONTEXT_TOKENS": ("context", "CONTEXT_TOKENS"),
    "GGUF_MAGIC": ("gguf_layout", "GGUF_MAGIC"),
    "Engine": ("model", "Engine"),
    "Pick": ("sampler_chain", "Pick"),
    "SamplerChain": ("sampler_chain", "SamplerChain"),
    "ScoredContinuation": ("steps", "ScoredContinuation"),
    "Step": ("steps", "Step"),
    "_only_extra_buffer_types": ("ggml_buffers", "only_extra_buffer_types"),
    "check_gguf_file": ("gguf_layout", "check_gguf_file"),
    "cpu_extra_buffer_types": ("ggml_buffers", "cpu_extra_buffer_types"),
    "init_backend": ("backend", "init_backend"),
    "llama_cpp_version": ("model", "llama_cpp_version"),
    "llama_system_info": ("model", "llama_system_info"),
}

__all__ = [
    "CONTEXT_TOKENS",
    "GGUF_MAGIC",
    "Engine",
    "Pick",
    "SamplerChain",
    "ScoredContinuation",
    "Step",
    "_only_extra_buffer_types",
    "check_gguf_file",
    "cpu_extra_buffer_types",
    "init_backend",
    "llama_cpp_version",
    "llama_system_info",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTED_FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, attribute = _EXPORTED_FROM[name]
    value = getattr(importlib.import_module(f"{__name__}.{module_name}"), attribute)
    globals()[name] = value
    return value
