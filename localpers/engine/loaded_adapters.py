"""The `Engine`'s LoRA adapters: load GGUF adapters onto the loaded backbone and switch the one that is active.

`LoadedAdapters` is a base class of `localpers.engine.model.Engine`. Adapters are loaded once
(`llama_adapter_lora_init`, refused when llama.cpp does not take the file for this backbone) and kept until the
engine is closed; `set_adapter` makes one of them, or none, active at a scale without reloading the backbone, and
clears the KV cache on a change (`Evaluation.reset`), since what the cache holds was computed with the old one.
A switch a Ctrl-C interrupted ends on the plain backbone with an empty cache, a state that is known.

What it does not do: write or check adapter files (`localpers.engine.adapters`), or free the adapters
(`Engine.close` does, with the model and context it sets up).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

from localpers.engine.backend import raise_pending_interrupt
from localpers.engine.evaluation import Evaluation
from localpers.engine.gguf_layout import check_gguf_file
from localpers.engine.llama import llama_cpp
from localpers.engine.prefix_files import file_identity
from localpers.errors import InputError, LocalpersError


class LoadedAdapters(Evaluation):
    """The GGUF LoRA adapters loaded on one backbone, by name, and the one active in its context."""

    _model: Any
    model_path: Path
    _adapters: dict[str, ctypes.c_void_p]
    _adapter_paths: dict[str, Path]

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
