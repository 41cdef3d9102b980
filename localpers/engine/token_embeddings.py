"""Rows of the backbone's token-embedding matrix, read on demand from the GGUF file.

The factored CARD head uses `U[v] = E[v] Q` with `E` the backbone's own (tied) token embeddings.
Gemma's `E` is 262,144 x 640: dequantised it would take 670 MB, so this keeps the quantised tensor
memory-mapped and dequantises only the rows asked for (a few dozen per decoding step).
It does not cache rows and does not know about the head.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from localpers.engine.gguf_layout import gguf_layout, map_tensor
from localpers.errors import LocalpersError

EMBEDDING_TENSOR = "token_embd.weight"


class TokenEmbeddings:
    """Memory-mapped `token_embd.weight` of a GGUF backbone; `rows(ids)` returns float32 `(n, n_embd)`.

    The tensor's place in the file comes from the GGUF header (`gguf_layout`, milliseconds).
    """

    def __init__(self, backbone: Path) -> None:
        import gguf

        self._quants = gguf.quants
        location = gguf_layout(Path(backbone)).tensor(EMBEDDING_TENSOR)
        if location is None:
            raise LocalpersError(f"{backbone} has no {EMBEDDING_TENSOR} tensor; the factored head needs it")
        self._type = gguf.GGMLQuantizationType(location.type)
        self.n_embd = int(location.shape[0])
        self.n_vocab = int(location.shape[1])
        # row v holds token v's embedding (quantised: the bytes of its blocks)
        self._data = map_tensor(Path(backbone), location)

    def rows(self, token_ids: np.ndarray | list[int]) -> np.ndarray:
        """Dequantised embedding rows for `token_ids`, float32 `(len(token_ids), n_embd)`."""
        ids = np.asarray(token_ids, dtype=np.int64)
        raw = np.asarray(self._data[ids])
        return np.asarray(self._quants.dequantize(raw, self._type), dtype=np.float32).reshape(
            len(ids), self.n_embd
        )
