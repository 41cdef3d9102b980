"""Running models on this machine: llama.cpp (the only package that imports `llama_cpp`), the encoder, torch.

- `model`, `vocabulary`, `taps`, `ggml_buffers`, `sampler_chain`, `backend`: the llama.cpp model (adapters,
  evaluation, scoring), its tokens and chat template, its layer taps, the weights' CPU buffer types, and its
  sampler chain; everything else in localpers reaches llama.cpp through these and the names re-exported here.
- `decoding`, `generation`: what a decoding step should do (settings, a method's sampler) and the decode loop.
- `backbone`, `cpu_buffers`, `token_embeddings`, `adapters`: the backbone GGUF, its weight layouts, its
  token embeddings, LoRA adapter files.
- `encoder`, `minilm`: the numpy sentence encoder. `torch_model`: the backbone in torch, for training only.
- `threads`: how many threads llama.cpp runs, and a wait policy for them that survives a busy machine (it loads
  llama.cpp, so it is imported first).
"""

from localpers.engine import threads  # noqa: F401  (loads llama_cpp under a wait policy; first)

# isort: split
from localpers.engine.backend import init_backend
from localpers.engine.ggml_buffers import cpu_extra_buffer_types
from localpers.engine.ggml_buffers import only_extra_buffer_types as _only_extra_buffer_types
from localpers.engine.model import (
    CONTEXT_TOKENS,
    GGUF_MAGIC,
    Engine,
    ScoredContinuation,
    Step,
    check_gguf_file,
    llama_cpp_version,
    llama_system_info,
)
from localpers.engine.sampler_chain import Pick, SamplerChain

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
