"""Where each tensor of a GGUF file lies, read from its header in milliseconds.

`gguf.GGUFReader` parses a header by building a numpy view for every metadata element; for Gemma's
262,144-token vocabulary that takes ~10 s on a 2-core CPU, although the tensors' own descriptions are all a
caller here needs. `gguf_layout` reads the same header (GGUF versions 2 and 3, little-endian) but steps over
metadata arrays without materialising them, keeping the single values (strings and numbers: the architecture,
the alignment, an adapter's type and alpha, a model's layer count), then reads each tensor's name, shape,
quantisation type and offset. The raw data's numpy dtype and shape follow gguf-py's own convention (quantised
blocks as uint8 rows), so `map_tensor` presents a tensor exactly as `GGUFReader` would:
`tests/test_gguf_layout.py` compares the two on the real backbone and on generated files. A malformed file is
refused with a `LocalpersError` naming it; `check_gguf_file` refuses a path that is not a GGUF file at all before
llama.cpp sees it. This module does not dequantise, name-map or validate tensor contents.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from localpers.errors import InputError, LocalpersError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# GGUF metadata value types (gguf.GGUFValueType, not imported: gguf costs 140 ms of every CLI start):
# the fixed-size ones and their sizes (uint8, int8, uint16, int16, uint32, int32, float32, bool, uint64, int64,
# float64), then string and array, which carry their own lengths.
_SCALAR_FORMATS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_SCALAR_SIZES = {value_type: struct.calcsize(layout) for value_type, layout in _SCALAR_FORMATS.items()}
_UINT32, _STRING, _ARRAY = 4, 8, 9
# tensor types gguf-py shows as plain numpy arrays; every other (quantised) type as rows of bytes
_PLAIN_DTYPES = {
    "F32": "<f4",
    "F16": "<f2",
    "F64": "<f8",
    "I8": "|i1",
    "I16": "<i2",
    "I32": "<i4",
    "I64": "<i8",
}


@dataclass(frozen=True)
class TensorLocation:
    """One tensor: its GGUF shape (ne0 first), and its raw data's numpy dtype and shape as gguf-py maps it."""

    name: str
    type: int  # gguf.GGMLQuantizationType
    offset: int  # from the start of the file
    n_bytes: int
    shape: tuple[int, ...]
    data_dtype: str
    data_shape: tuple[int, ...]


@dataclass(frozen=True)
class GGUFLayout:
    architecture: str
    tensors: tuple[TensorLocation, ...]
    # the header's single-valued metadata (strings, numbers, booleans); arrays are skipped
    values: Mapping[str, str | int | float | bool] = field(default_factory=dict)

    def tensor(self, name: str) -> TensorLocation | None:
        return next((tensor for tensor in self.tensors if tensor.name == name), None)


def check_gguf_file(path: Path, what: str = "model") -> None:
    """Refuse a missing, empty or non-GGUF file with a one-line error (exit 2) before llama.cpp sees it."""
    if not path.is_file():
        there = path.exists()
        raise InputError(f"{what} file {path} {'is not a regular file' if there else 'does not exist'}")
    try:
        with path.open("rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise InputError(f"{what} file {path} cannot be read ({exc.strerror or exc})") from None
    if magic != GGUF_MAGIC:
        raise InputError(f"{what} file {path} is not a GGUF file (bad magic {magic!r}); give a .gguf file")


def gguf_layout(path: Path) -> GGUFLayout:
    """The architecture and tensor locations of the GGUF at `path`."""
    try:
        data = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as exc:
        raise LocalpersError(f"cannot read {path}: {exc}") from exc
    try:
        return _HeaderReader(memoryview(data)).layout()
    except struct.error as exc:  # only raised by a read past the end: Python's wording says nothing to a user
        raise LocalpersError(f"{path} is truncated ({len(data)} bytes): not a complete GGUF file") from exc
    except (ValueError, KeyError, UnicodeDecodeError, RecursionError, OverflowError) as exc:
        raise LocalpersError(f"{path} is not a GGUF file localpers can read ({exc})") from exc


def map_tensor(path: Path, location: TensorLocation) -> np.ndarray:
    """The tensor's raw data, memory-mapped read-only (quantised blocks stay as gguf-py's uint8 rows)."""
    try:
        return np.memmap(
            path,
            dtype=np.dtype(location.data_dtype),
            mode="r",
            offset=location.offset,
            shape=location.data_shape,
        )
    except (OSError, ValueError) as exc:
        raise LocalpersError(f"cannot map tensor {location.name} of {path}: {exc}") from exc


class _HeaderReader:
    """One pass over a GGUF header held in `buffer`; `struct.error` or `ValueError` on anything malformed."""

    def __init__(self, buffer: memoryview) -> None:
        self.buffer = buffer
        self.offset = 0

    def layout(self) -> GGUFLayout:
        magic, version, n_tensors, n_values = self._unpack("<4sIQQ")
        if magic != GGUF_MAGIC:
            raise ValueError("no GGUF magic")
        if version not in SUPPORTED_VERSIONS:
            raise ValueError(f"GGUF version {version} (little-endian 2 or 3 expected)")
        values: dict[str, str | int | float | bool] = {}
        alignment = DEFAULT_ALIGNMENT
        for _ in range(n_values):
            key = self._string()
            (value_type,) = self._unpack("<I")
            if value_type == _STRING:
                values[key] = self._string(errors="replace")
            elif value_type in _SCALAR_FORMATS:
                (values[key],) = self._unpack(_SCALAR_FORMATS[value_type])
            else:
                self._skip_value(value_type)
            if key == "general.alignment" and value_type == _UINT32:  # llama.cpp reads it only as uint32
                alignment = int(values[key])
                if alignment == 0 or alignment & (alignment - 1):
                    raise ValueError(f"alignment {alignment} is not a power of two")
        architecture = values.get("general.architecture", "")
        described = [self._tensor_description() for _ in range(n_tensors)]
        data_start = -(-self.offset // alignment) * alignment
        tensors = tuple(
            _location(name, shape, kind, data_start + offset) for name, shape, kind, offset in described
        )
        for tensor in tensors:
            if tensor.offset + tensor.n_bytes > len(self.buffer):
                raise ValueError(f"tensor {tensor.name} runs past the end of the file")
        return GGUFLayout(
            architecture=architecture if isinstance(architecture, str) else "", tensors=tensors, values=values
        )

    def _unpack(self, layout: str) -> tuple:
        values = struct.unpack_from(layout, self.buffer, self.offset)
        self.offset += struct.calcsize(layout)
        return values

    def _string(self, errors: str = "strict") -> str:
        (length,) = self._unpack("<Q")
        end = self.offset + length
        if end > len(self.buffer):
            raise ValueError("a string runs past the end of the file")
        text = bytes(self.buffer[self.offset : end]).decode("utf-8", errors)
        self.offset = end
        return text

    def _skip_value(self, value_type: int) -> None:
        if value_type in _SCALAR_SIZES:
            self.offset += _SCALAR_SIZES[value_type]
        elif value_type == _STRING:
            (length,) = self._unpack("<Q")
            self.offset += length
        elif value_type == _ARRAY:
            item_type, count = self._unpack("<IQ")
            if item_type in _SCALAR_SIZES:
                self.offset += _SCALAR_SIZES[item_type] * count
            else:
                for _ in range(count):
                    self._skip_value(item_type)
                    if self.offset > len(self.buffer):
                        break
        else:
            raise ValueError(f"unknown metadata value type {value_type}")
        if self.offset > len(self.buffer):
            raise ValueError("metadata runs past the end of the file")

    def _tensor_description(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self._string()
        (n_dims,) = self._unpack("<I")
        if n_dims > 8:
            raise ValueError(f"tensor {name} has {n_dims} dimensions")
        shape = self._unpack(f"<{n_dims}Q")
        kind, offset = self._unpack("<IQ")
        return name, tuple(int(n) for n in shape), int(kind), int(offset)


def _location(name: str, shape: tuple[int, ...], kind: int, offset: int) -> TensorLocation:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    quantisation = GGMLQuantizationType(kind)
    block_size, type_size = GGML_QUANT_SIZES[quantisation]
    numpy_shape = tuple(reversed(shape))
    plain = _PLAIN_DTYPES.get(quantisation.name)
    if plain is None:  # quantised: gguf-py shows each row of blocks as bytes
        if not shape or shape[0] % block_size:
            raise ValueError(f"tensor {name}: {shape} does not hold whole {quantisation.name} blocks")
        numpy_shape = (*numpy_shape[:-1], shape[0] // block_size * type_size)
    return TensorLocation(
        name=name,
        type=kind,
        offset=offset,
        n_bytes=math.prod(shape) * type_size // block_size,
        shape=shape,
        data_dtype=plain or "|u1",
        data_shape=numpy_shape,
    )
