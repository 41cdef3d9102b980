"""Rows of the backbone's token-embedding matrix, read on demand from the GGUF file.

The factored CARD head uses `U[v] = E[v] Q` with `E` the backbone's own (tied) token embeddings.
Gemma's `E` is 262,144 x 640: dequantised it would take 670 MB, so this keeps the quantised tensor
memory-mapped and dequantises only the rows asked for (a few dozen per decoding step).
It does not cache rows and does not know about the head.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from localpers.errors import LocalpersError

EMBEDDING_TENSOR = "token_embd.weight"


class TokenEmbeddings:
    """Memory-mapped `token_embd.weight` of a GGUF backbone; `rows(ids)` returns float32 `(n, n_embd)`."""

    def __init__(self, backbone: Path) -> None:
        import gguf

        self._quants = gguf.quants
        try:
            reader = gguf.GGUFReader(str(backbone))
        except (OSError, ValueError) as exc:
            raise LocalpersError(f"cannot read token embeddings from {backbone}: {exc}") from exc
        tensors = {tensor.name: tensor for tensor in reader.tensors}
        if EMBEDDING_TENSOR not in tensors:
            raise LocalpersError(f"{backbone} has no {EMBEDDING_TENSOR} tensor; the factored head needs it")
        tensor = tensors[EMBEDDING_TENSOR]
        self._data = tensor.data  # (n_vocab, bytes_per_row) for quantised types, (n_vocab, n_embd) for float
        self._type = tensor.tensor_type
        self.n_embd = int(tensor.shape[0])
        self.n_vocab = int(tensor.shape[1])

    def rows(self, token_ids: np.ndarray | list[int]) -> np.ndarray:
        """Dequantised embedding rows for `token_ids`, float32 `(len(token_ids), n_embd)`."""
        ids = np.asarray(token_ids, dtype=np.int64)
        raw = self._data[ids]
        return np.asarray(self._quants.dequantize(raw, self._type), dtype=np.float32).reshape(
            len(ids), self.n_embd
        )
