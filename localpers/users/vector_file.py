"""A user vector's file: lambda_u as one float32 tensor in safetensors with string metadata, made and read checked.

`vector_file_bytes` makes the file (refusing anything but a finite, non-empty 1-D array); `read_vector_file`
checks a file's bytes against the sha256 and dimension its state.json records and returns the array and its
metadata, each problem a one-line error naming the file and what to do. Where the file lives, and how it is
committed with state.json, is `localpers.users.folder`'s; this module reads and writes no file itself.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localpers.errors import InputError
from localpers.untrusted import one_line

if TYPE_CHECKING:
    import numpy as np

VECTOR_TENSOR = "lambda"


def vector_file_bytes(vector: np.ndarray, meta: dict[str, str] | None) -> bytes:
    """The safetensors file for a user vector; rejects anything but a finite, non-empty 1-D array."""
    import numpy as np
    from safetensors.numpy import save

    array = np.ascontiguousarray(np.asarray(vector, dtype=np.float32))
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"a user vector must be a non-empty 1-D array, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError("a user vector must hold finite numbers only")
    meta = dict(meta or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise TypeError("vector metadata must map strings to strings")
    return _canonical(save({VECTOR_TENSOR: array}, metadata=meta or None))


def _canonical(data: bytes) -> bytes:
    """`data` with its safetensors header's keys sorted: safetensors writes the metadata in an order that varies
    from call to call, so the same vector got another file name and sha256 at each refit. The header stays padded
    to 8 bytes with spaces, as safetensors pads it, and the tensor bytes are unchanged."""
    (length,) = struct.unpack("<Q", data[:8])
    header = json.dumps(json.loads(data[8 : 8 + length]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data[8 + length :]


def read_vector_file(
    path: Path, data: bytes, state: dict[str, Any], state_path: Path, refit_advice: str
) -> tuple[np.ndarray, dict[str, str]]:
    """The vector and metadata in `data` (the bytes of `path`), checked against `state` (read from `state_path`):
    its `vector_sha256` and `vector_dim`; `refit_advice` ends every error."""
    import numpy as np
    from safetensors.numpy import load

    if "vector_sha256" not in state:
        raise InputError(
            f"{state_path} is damaged: it names {path.name} but has no field 'vector_sha256'; {refit_advice}"
        )
    if hashlib.sha256(data).hexdigest() != state.get("vector_sha256"):
        raise InputError(
            f"{path} does not match the sha256 recorded in {state_path.name} (changed or damaged); {refit_advice}"
        )
    try:
        tensors = load(data)
    except Exception as exc:  # safetensors raises several types for malformed files
        raise InputError(f"{path} is not a readable safetensors file ({exc}); {refit_advice}") from None
    array = tensors.get(VECTOR_TENSOR)
    if array is None:
        raise InputError(f"{path} has no tensor {VECTOR_TENSOR!r}; {refit_advice}")
    if array.dtype != np.float32 or array.ndim != 1 or array.size == 0:
        raise InputError(
            f"{path}: tensor {VECTOR_TENSOR!r} is {array.dtype} {tuple(array.shape)}, "
            f"expected float32 (D,); {refit_advice}"
        )
    dim = state.get("vector_dim")
    if dim is not None and (not isinstance(dim, int) or isinstance(dim, bool)):
        raise InputError(
            f"{state_path} is damaged: field 'vector_dim' is {one_line(repr(dim), 40)}"
            f" ({type(dim).__name__}), not an integer; {refit_advice}"
        )
    if dim is not None and dim != array.size:
        raise InputError(
            f"{path} has {array.size} values but field 'vector_dim' of {state_path.name} says {dim}; {refit_advice}"
        )
    if not np.all(np.isfinite(array)):
        raise InputError(f"{path} holds non-finite values; {refit_advice}")
    return array, _metadata(data)


def _metadata(data: bytes) -> dict[str, str]:
    """The `__metadata__` strings of a safetensors file already known to be valid."""
    (header_length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_length])
    return dict(header.get("__metadata__") or {})
