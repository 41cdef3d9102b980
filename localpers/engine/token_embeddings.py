"""Rows of the backbone's token-embedding matrix, read on demand from the GGUF file.

The factored CARD head uses `U[v] = E[v] Q` with `E` the backbone's own (tied) token embeddings.
Gemma's `E` is 262,144 x 640: dequantised it would take 670 MB, so this keeps the quantised tensor
memory-mapped and dequantises only the rows asked for (a few dozen per decoding step).
It does not cache rows and does not know about the head.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from localpers.atomic import atomic_write_text
from localpers.errors import LocalpersError
from localpers.paths import cache_dir

EMBEDDING_TENSOR = "token_embd.weight"


class TokenEmbeddings:
    """Memory-mapped `token_embd.weight` of a GGUF backbone; `rows(ids)` returns float32 `(n, n_embd)`.

    Parsing a GGUF header with `gguf.GGUFReader` walks the whole 262k-entry vocabulary (seconds);
    given the backbone's sha256, the tensor's offset and type are remembered in the cache directory
    and later processes map the rows directly.
    """

    def __init__(self, backbone: Path, sha256: str | None = None) -> None:
        import gguf

        self._quants = gguf.quants
        location = _cached_location(sha256) if sha256 else None
        if location is None:
            location = _read_location(Path(backbone))
            if sha256:
                _save_location(sha256, location)
        self._type = gguf.GGMLQuantizationType(location["type"])
        self.n_embd = int(location["n_embd"])
        self.n_vocab = int(location["n_vocab"])
        try:
            self._data = np.memmap(
                backbone, dtype=np.uint8, mode="r", offset=int(location["offset"]),
                shape=(self.n_vocab, int(location["row_bytes"])),
            )  # fmt: skip
        except (OSError, ValueError) as exc:
            raise LocalpersError(f"cannot map token embeddings of {backbone}: {exc}") from exc

    def rows(self, token_ids: np.ndarray | list[int]) -> np.ndarray:
        """Dequantised embedding rows for `token_ids`, float32 `(len(token_ids), n_embd)`."""
        ids = np.asarray(token_ids, dtype=np.int64)
        raw = np.asarray(self._data[ids])
        if self._type == self._type.F32:
            return raw.view(np.float32).reshape(len(ids), self.n_embd)
        return np.asarray(self._quants.dequantize(raw, self._type), dtype=np.float32).reshape(
            len(ids), self.n_embd
        )


def _read_location(backbone: Path) -> dict[str, int]:
    import gguf

    try:
        reader = gguf.GGUFReader(str(backbone))
    except (OSError, ValueError) as exc:
        raise LocalpersError(f"cannot read token embeddings from {backbone}: {exc}") from exc
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    if EMBEDDING_TENSOR not in tensors:
        raise LocalpersError(f"{backbone} has no {EMBEDDING_TENSOR} tensor; the factored head needs it")
    tensor = tensors[EMBEDDING_TENSOR]
    n_vocab = int(tensor.shape[1])
    return {
        "offset": int(tensor.data_offset),
        "type": int(tensor.tensor_type),
        "n_embd": int(tensor.shape[0]),
        "n_vocab": n_vocab,
        "row_bytes": int(tensor.n_bytes) // n_vocab,
    }


def _location_file(sha256: str) -> Path:
    return cache_dir() / "backbones" / f"{sha256[:32]}.token_embd.json"


def _cached_location(sha256: str) -> dict[str, int] | None:
    try:
        location = json.loads(_location_file(sha256).read_text())
        return {key: int(location[key]) for key in ("offset", "type", "n_embd", "n_vocab", "row_bytes")}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _save_location(sha256: str, location: dict[str, int]) -> None:
    target = _location_file(sha256)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(target, json.dumps(location))
    except OSError:
        pass  # a read-only cache only costs the slow path next time
