"""The CARD personalization head on the device: features -> z, sequence rewards, top-k logit correction.

Notation (`../shared/DESIGN.md` section 3): layer features `f_t` (n_taps x n_embd) are RMS-normalised per layer
and concatenated; `z_t = P f_t` (D); the user vector `lambda` (D) modulates `s_t = z_t * lambda`; the
correction of token v is `strength * U[v] . s_t`, applied to the top-k cluster logits only.
`U` is either factored, `U[v] = E[v] Q` with the backbone's token embeddings `E`, or a sparse full
matrix whose untrained rows are zero. The sequence reward is linear in lambda:
`R(y) = lambda . g(y)` with `g(y) = alpha * sum_t U[y_t] * z_t` (divided by T when length-normalised).

This module only does inference-side numpy maths and reads/writes `head.safetensors`; what a bundle's head
must be (its manifest fields, its file's tensors) is `localpers.methods.card.head_spec`, training the head
(publisher) and fitting lambda (device) live elsewhere.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from localpers.atomic import atomic_write_bytes
from localpers.engine.token_embeddings import TokenEmbeddings
from localpers.errors import LocalpersError
from localpers.methods.card.head_spec import HeadConfig, check_head_tensors, read_head_file

RMS_EPS = 1e-6
# Token rows `E[v] Q` a factored head remembers (16 MB at D = 128); a headline writer's candidates stay far below.
U_CACHE_ROWS = 32768


def normalise_features(features: np.ndarray) -> np.ndarray:
    """RMS-normalise each layer and concatenate: `(..., n_taps, n_embd)` -> `(..., n_taps * n_embd)`."""
    x = np.asarray(features, dtype=np.float32)
    rms = np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_EPS)
    normalised = x / rms
    return normalised.reshape(*normalised.shape[:-2], -1)


def top_k_indices(logits: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest logits (unordered), without a full partition of a 262k vocabulary."""
    peak = float(logits.max())
    for margin in (8.0, 16.0, 32.0):
        candidates = np.flatnonzero(logits >= peak - margin)
        if candidates.size >= k:
            break
    else:
        candidates = np.arange(logits.size)
    if candidates.size > k:
        candidates = candidates[np.argpartition(logits[candidates], -k)[-k:]]
    return candidates


class CardHead:
    """Shared head `(P, Q or sparse U)` plus per-cluster default vectors, as published in a bundle."""

    def __init__(
        self,
        config: HeadConfig,
        projection: np.ndarray,
        default_vectors: np.ndarray,
        *,
        factor_q: np.ndarray | None = None,
        u_ids: np.ndarray | None = None,
        u_rows: np.ndarray | None = None,
        embeddings: TokenEmbeddings | None = None,
    ) -> None:
        self.config = config
        self.P = np.ascontiguousarray(projection, dtype=np.float32)
        self.default_vectors = np.asarray(default_vectors, dtype=np.float32)
        self.Q = None if factor_q is None else np.ascontiguousarray(factor_q, dtype=np.float32)
        self.embeddings = embeddings
        self._row_slots: np.ndarray | None = None  # token id -> row of _row_cache, -1 = not computed yet
        self._row_cache: np.ndarray | None = None
        self._rows_filled = 0
        self._full_rows: dict[int, int] = {}
        self.U_rows = None if u_rows is None else np.asarray(u_rows, dtype=np.float32)
        self.U_ids = None if u_ids is None else np.asarray(u_ids, dtype=np.int64)
        if config.u == "factored":
            if self.Q is None or embeddings is None:
                raise LocalpersError("a factored head needs Q and the backbone's token embeddings")
        elif config.u == "full":
            if self.U_rows is None or self.U_ids is None:
                raise LocalpersError("a full-U head needs U_ids and U_rows")
            self._full_rows = {int(t): i for i, t in enumerate(self.U_ids)}
        else:
            raise LocalpersError(f"unknown head type u={config.u!r}; expected 'factored' or 'full'")
        if self.P.shape[0] != config.d or self.default_vectors.shape[1] != config.d:
            raise LocalpersError(f"head tensors do not match D={config.d}: P {self.P.shape}")

    # ------------------------------------------------------------------ I/O
    @classmethod
    def load(cls, path: Path, config: HeadConfig, embeddings: TokenEmbeddings | None) -> CardHead:
        tensors = read_head_file(path)
        try:
            check_head_tensors(tensors, config, None if embeddings is None else embeddings.n_embd)
            return cls(
                config,
                tensors["P"],
                tensors["default_vectors"],
                factor_q=tensors.get("Q"),
                u_ids=tensors.get("U_ids"),
                u_rows=tensors.get("U_rows"),
                embeddings=embeddings,
            )
        except KeyError as exc:
            raise LocalpersError(f"{path}: missing tensor {exc}") from exc
        except LocalpersError as exc:
            raise LocalpersError(f"{path}: {exc}") from exc

    def save(self, path: Path) -> Path:
        """Write the head's tensors to `path` all at once, synced to disk (the publisher's head stage is kept and
        reused: a rename that outlived a power cut without its data left a short file the next publish took)."""
        from safetensors.numpy import save

        tensors: dict[str, np.ndarray] = {"P": self.P, "default_vectors": self.default_vectors}
        if self.Q is not None:
            tensors["Q"] = self.Q
        if self.U_rows is not None and self.U_ids is not None:
            tensors["U_rows"] = self.U_rows
            tensors["U_ids"] = self.U_ids
        path = Path(path)
        atomic_write_bytes(path, save(tensors))
        return path

    # ------------------------------------------------------------------ maths
    @property
    def d(self) -> int:
        return self.config.d

    def project(self, features: np.ndarray) -> np.ndarray:
        """`z = P f` for features `(..., n_taps, n_embd)`; returns `(..., D)`."""
        return normalise_features(features) @ self.P.T

    def u_rows(self, token_ids: np.ndarray | list[int]) -> np.ndarray:
        """`U[v]` for each token id, `(n, D)`; untrained rows of a full U are zero."""
        ids = np.asarray(token_ids, dtype=np.int64)
        if self.config.u == "factored":
            return self._factored_rows(ids)
        assert self.U_rows is not None
        out = np.zeros((len(ids), self.d), dtype=np.float32)
        for i, token in enumerate(ids):
            row = self._full_rows.get(int(token))
            if row is not None:
                out[i] = self.U_rows[row]
        return out

    def _factored_rows(self, ids: np.ndarray) -> np.ndarray:
        """`E[v] Q`, remembered per token id: decoding asks for the same few thousand tokens again and again,
        and dequantising their embedding rows was most of the correction's time per step."""
        assert self.embeddings is not None and self.Q is not None
        if self._row_slots is None:
            self._row_slots = np.full(self.embeddings.n_vocab, -1, dtype=np.int32)
            self._row_cache = np.empty((U_CACHE_ROWS, self.d), dtype=np.float32)  # pages touched as filled
        assert self._row_cache is not None
        slots = self._row_slots[ids]
        missing = slots < 0
        if not missing.any():
            return self._row_cache[slots]
        new = np.unique(ids[missing])
        if self._rows_filled + len(new) > U_CACHE_ROWS:  # full: start again rather than track recency
            self._row_slots.fill(-1)
            self._rows_filled = 0
            new = np.unique(ids)
            if len(new) > U_CACHE_ROWS:  # more than the cache holds: computed, not remembered
                return self.embeddings.rows(ids) @ self.Q
        rows = self.embeddings.rows(new) @ self.Q
        placed = np.arange(self._rows_filled, self._rows_filled + len(new), dtype=np.int32)
        self._row_cache[placed] = rows
        self._row_slots[new] = placed
        self._rows_filled += len(new)
        return self._row_cache[self._row_slots[ids]]

    def sequence_feature(self, tokens: list[int] | np.ndarray, features: np.ndarray) -> np.ndarray:
        """`g(y) = alpha * sum_t U[y_t] * z_t` (over T when length-normalised); `(D,)`."""
        z = self.project(features)
        g = self.config.alpha * (self.u_rows(tokens) * z).sum(axis=0)
        if self.config.length_normalised:
            g = g / max(1, len(tokens))
        return g.astype(np.float32)

    def default_vector(self, cluster: int | None) -> np.ndarray:
        """The published default lambda of a cluster (None = the global default)."""
        row = self.default_vectors.shape[0] - 1 if cluster is None else cluster
        if not 0 <= row < self.default_vectors.shape[0]:
            raise LocalpersError(f"cluster {cluster} is not in this bundle's head; refit the user")
        return self.default_vectors[row].copy()

    def correction(
        self,
        candidates: np.ndarray,
        features: np.ndarray,
        user_vector: np.ndarray,
        *,
        strength: float | None = None,
    ) -> np.ndarray:
        """`strength * U[v] . (P f * lambda)` for each candidate token id `v`: what CARD adds to its logit."""
        scale = self.config.default_strength if strength is None else strength
        s = self.project(features) * user_vector
        return scale * (self.u_rows(candidates) @ s)

    def correct(
        self,
        logits: np.ndarray,
        features: np.ndarray,
        user_vector: np.ndarray,
        *,
        strength: float | None = None,
        top_k: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Corrected logits, plus the top-k ids and their corrections.

        Only the top-k tokens of the cluster logits are corrected, and only they stay eligible: every
        other token is set to -inf, so however strong the correction, the next token is one the
        cluster model ranked in its top k (a large negative correction cannot promote an outsider).
        """
        k = top_k or self.config.top_k
        candidates = top_k_indices(logits, k)
        delta = self.correction(candidates, features, user_vector, strength=strength)
        corrected = np.full_like(logits, -np.inf)
        corrected[candidates] = logits[candidates] + delta
        return corrected, candidates, delta
