"""ggml's extra CPU buffer types as this llama.cpp build offers them, and hiding some of them for one load.

`localpers.engine.cpu_buffers` decides which extra buffer types the backbone's weights may use (it imports no
llama.cpp); this module applies that decision through ggml's C API: `cpu_extra_buffer_types` lists what the
build offers, `only_extra_buffer_types` lets llama.cpp see only the allowed ones while a model loads, and
`BUFFER_SIZE_LINE` reads from llama.cpp's load log how many MiB went to each type. It loads no model itself
(`localpers.engine.model.Engine` does) and decides nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
from collections.abc import Iterator, Sequence
from typing import Any

from localpers.engine.backend import init_backend
from localpers.engine.llama import _ggml

_libggml = _ggml.libggml
_GGML_BACKEND_DEVICE_TYPE_CPU = 0
BUFFER_SIZE_LINE = re.compile(r"(\S+) model buffer size =\s*([0-9.]+) MiB")


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
def only_extra_buffer_types(allowed: Sequence[str]) -> Iterator[None]:
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
