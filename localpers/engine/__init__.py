"""The only package that imports `llama_cpp`: the model (`model`), its sampler chain (`sampler_chain`), setup.

Everything else in localpers reaches llama.cpp through the names re-exported here.
"""

from localpers.engine.backend import init_backend
from localpers.engine.model import (
    GGUF_MAGIC,
    Engine,
    ScoredContinuation,
    Step,
    _only_extra_buffer_types,
    check_gguf_file,
    cpu_extra_buffer_types,
    llama_cpp_version,
    llama_system_info,
)
from localpers.engine.sampler_chain import Pick, SamplerChain

__all__ = [
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
