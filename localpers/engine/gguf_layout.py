"""Where each tensor of a GGUF file lies, remembered by the file's sha256 so later processes skip the header walk.

`gguf.GGUFReader` parses a header by building a numpy view for every metadata element; for Gemma's
262,144-token vocabulary that is ~10 s on a 2-core CPU, while the tensors' own descriptions take
milliseconds to use. `gguf_layout(path, sha256)` reads the layout once with `GGUFReader` (the library
stays the only GGUF parser here) and keeps the architecture and each tensor's name, quantisation type,
byte offset and shapes in the cache directory, keyed by the file's sha256 and the gguf version;
`map_tensor` memory-maps one tensor's raw data as `GGUFReader` presents it. This module does not
dequantise, name-map or validate tensor contents.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import numpy as np

from localpers.atomic import atomic_write_text
from localpers.errors import LocalpersError
from localpers.paths import cache_dir


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

    def tensor(self, name: str) -> TensorLocation | None:
        return next((tensor for tensor in self.tensors if tensor.name == name), None)


def gguf_layout(path: Path, sha256: str | None = None) -> GGUFLayout:
    """The layout of the GGUF at `path`: from the cache when this file (`sha256`) was read before."""
    cache_file = _cache_file(sha256) if sha256 else None
    if cache_file is not None:
        cached = _read_cached(cache_file)
        if cached is not None:
            return cached
    layout = _read_layout(path)
    if cache_file is not None:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            payload = {"gguf": _gguf_version(), "architecture": layout.architecture}
            atomic_write_text(
                cache_file, json.dumps({**payload, "tensors": [asdict(t) for t in layout.tensors]})
            )
        except OSError:
            pass  # a read-only cache only costs the slow read next time
    return layout


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


def _read_layout(path: Path) -> GGUFLayout:
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        architecture = bytes(field.parts[field.data[0]]).decode("utf-8")
    except (OSError, ValueError, KeyError, IndexError, UnicodeDecodeError) as exc:
        raise LocalpersError(f"cannot read the tensor layout of {path}: {exc}") from exc
    tensors = tuple(
        TensorLocation(
            name=tensor.name,
            type=int(tensor.tensor_type),
            offset=int(tensor.data_offset),
            n_bytes=int(tensor.n_bytes),
            shape=tuple(int(n) for n in tensor.shape),
            data_dtype=tensor.data.dtype.str,
            data_shape=tuple(int(n) for n in tensor.data.shape),
        )
        for tensor in reader.tensors
    )
    return GGUFLayout(architecture=architecture, tensors=tensors)


def _cache_file(sha256: str) -> Path:
    return cache_dir() / "backbones" / f"{sha256[:32]}.layout.json"


def _read_cached(cache_file: Path) -> GGUFLayout | None:
    """The cached layout, or None when it is missing, damaged or written by another gguf version."""
    try:
        saved = json.loads(cache_file.read_text())
        if saved["gguf"] != _gguf_version():
            return None
        tensors = tuple(
            TensorLocation(
                name=str(t["name"]),
                type=int(t["type"]),
                offset=int(t["offset"]),
                n_bytes=int(t["n_bytes"]),
                shape=tuple(int(n) for n in t["shape"]),
                data_dtype=str(t["data_dtype"]),
                data_shape=tuple(int(n) for n in t["data_shape"]),
            )
            for t in saved["tensors"]
        )
        return GGUFLayout(architecture=str(saved["architecture"]), tensors=tensors)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _gguf_version() -> str:
    try:
        return metadata.version("gguf")
    except metadata.PackageNotFoundError:
        return "unknown"
