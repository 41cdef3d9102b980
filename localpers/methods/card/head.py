"""The CARD personalization head on the device: features -> z, sequence rewards, top-k logit correction.

Notation (DESIGN.md section 3): layer features `f_t` (n_taps x n_embd) are RMS-normalised per layer
and concatenated; `z_t = P f_t` (D); the user vector `lambda` (D) modulates `s_t = z_t * lambda`; the
correction of token v is `strength * U[v] . s_t`, applied to the top-k cluster logits only.
`U` is either factored, `U[v] = E[v] Q` with the backbone's token embeddings `E`, or a sparse full
matrix whose untrained rows are zero. The sequence reward is linear in lambda:
`R(y) = lambda . g(y)` with `g(y) = alpha * sum_t U[y_t] * z_t` (divided by T when length-normalised).

This module only does inference-side numpy maths and reads/writes `head.safetensors`; training the
head (publisher) and fitting lambda (device) live elsewhere.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localpers.engine.token_embeddings import TokenEmbeddings
from localpers.errors import LocalpersError

RMS_EPS = 1e-6
# Token rows `E[v] Q` a factored head remembers (16 MB at D = 128); a headline writer's candidates stay far below.
U_CACHE_ROWS = 32768
BASES = ("cluster", "global")  # the adapters CARD's correction can sit on (`HeadConfig.base`)
# What a manifest's head may ask for. CARD corrects the top 20 tokens; a k in the thousands would score most
# of the vocabulary at every step. Calibrated scales are well under 1 (the demo bundle's alpha: 0.066).
MAX_D, MAX_TOP_K, MAX_SCALE = 4096, 1000, 1000.0


@dataclass(frozen=True)
class HeadConfig:
    """Head hyperparameters, stored in the bundle manifest under `head`."""

    d: int = 128
    layers: tuple[int, ...] = (14, 15, 16, 17)
    u: str = "factored"  # "factored" or "full"
    alpha: float = 1.0
    top_k: int = 20
    length_normalised: bool = False
    layer_norm: str = "rms"
    strength: float | None = None  # default decoding strength; None = alpha (the training scale)
    # The adapter the correction sits on: "cluster" (the user's cluster adapter, CARD as published) or "global"
    # (the conditioned global adapter, which beat the cluster adapters on held-out train authors: RESULTS 0l, 0m).
    # Bundles without the field were published for "cluster".
    base: str = "cluster"

    @property
    def default_strength(self) -> float:
        return self.alpha if self.strength is None else self.strength

    @classmethod
    def from_manifest(cls, entry: dict[str, Any]) -> HeadConfig:
        try:
            config = cls(
                d=int(entry["d"]),
                layers=tuple(int(x) for x in entry["layers"]),
                u=str(entry.get("u", "factored")),
                alpha=float(entry.get("alpha", 1.0)),
                top_k=int(entry.get("top_k", 20)),
                length_normalised=bool(entry.get("length_normalised", False)),
                layer_norm=str(entry.get("layer_norm", "rms")),
                strength=None if entry.get("strength") is None else float(entry["strength"]),
                base=str(entry.get("base", "cluster")),
            )
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise LocalpersError(
                f"bundle manifest field 'head' is malformed ({exc}); re-pull the bundle"
            ) from exc
        if config.base not in BASES:
            raise LocalpersError(
                f"bundle manifest field 'head.base' is {config.base!r}, not one of {', '.join(BASES)};"
                " re-pull the bundle or upgrade localpers"
            )
        problem = config._out_of_range()
        if problem:
            raise LocalpersError(f"bundle manifest field 'head.{problem}; re-pull the bundle")
        return config

    def _out_of_range(self) -> str | None:
        """What in this config no head can serve, as "<field>' is <value>; it must ...", or None."""
        checks = (
            ("d", self.d, 1 <= self.d <= MAX_D, f"be from 1 to {MAX_D}"),
            (
                "layers",
                list(self.layers),
                bool(self.layers) and list(self.layers) == sorted(set(self.layers)) and self.layers[0] >= 0,
                "list layer numbers >= 0 in increasing order",
            ),
            ("top_k", self.top_k, 1 <= self.top_k <= MAX_TOP_K, f"be from 1 to {MAX_TOP_K}"),
            (
                "alpha",
                self.alpha,
                math.isfinite(self.alpha) and 0 <= self.alpha <= MAX_SCALE,
                f"be from 0 to {MAX_SCALE:g}",
            ),
            (
                "strength",
                self.strength,
                self.strength is None or (math.isfinite(self.strength) and 0 <= self.strength <= MAX_SCALE),
                f"be from 0 to {MAX_SCALE:g}",
            ),
        )
        for field, value, ok, rule in checks:
            if not ok:
                return f"{field}' is {value}; it must {rule}"
        return None

    def check_backbone(self, n_layer: int) -> None:
        """Refuse a head that taps layers the backbone does not have (the engine would wrap them round)."""
        if self.layers[-1] >= n_layer:
            raise LocalpersError(
                f"bundle manifest field 'head.layers' names layer {self.layers[-1]}, but the backbone has"
                f" {n_layer} (0-{n_layer - 1}); the bundle was published for another backbone: re-pull it"
            )

    def to_manifest(self) -> dict[str, Any]:
        return {
            "d": self.d,
            "layers": list(self.layers),
            "u": self.u,
            "alpha": self.alpha,
            "top_k": self.top_k,
            "length_normalised": self.length_normalised,
            "layer_norm": self.layer_norm,
            **({} if self.strength is None else {"strength": self.strength}),
            **({} if self.base == "cluster" else {"base": self.base}),
        }


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


def _check_tensors(tensors: dict[str, np.ndarray], config: HeadConfig, n_embd: int | None) -> None:
    """Refuse a head file whose tensors cannot serve `config` (wrong shapes, NaN, negative token ids).

    Shapes: P `(D, n_taps * n_embd)`, default_vectors `(n >= 1, D)`, Q `(n_embd, D)`, U_rows `(n, D)` with U_ids
    `(n,)`; n_embd is the backbone's width when it is known. A missing tensor is left to the caller.
    """
    d, taps = config.d, len(config.layers)
    width = "n_taps * n_embd" if n_embd is None else str(taps * n_embd)
    expected = {
        "P": (d, None if n_embd is None else taps * n_embd),
        "default_vectors": (None, d),
        "Q": (n_embd, d),
        "U_rows": (None, d),
    }
    for name, (rows, columns) in expected.items():
        if name not in tensors:
            continue
        tensor = tensors[name]
        shape_ok = (
            tensor.ndim == 2
            and tensor.shape[0] > 0
            and (rows is None or tensor.shape[0] == rows)
            and (columns is None or tensor.shape[1] == columns)
            and (name != "P" or tensor.shape[1] % taps == 0)
        )
        if not shape_ok:
            wanted = {"P": f"({d}, {width})", "Q": f"({n_embd or 'n_embd'}, {d})"}.get(name, f"(n, {d})")
            raise LocalpersError(f"tensor {name!r} has shape {tuple(tensor.shape)}, D={d} needs {wanted}")
        if not np.issubdtype(tensor.dtype, np.floating) or not np.isfinite(tensor).all():
            raise LocalpersError(f"tensor {name!r} holds values that are not finite numbers")
    if "U_ids" in tensors:
        ids = tensors["U_ids"]
        rows = tensors["U_rows"].shape[0] if "U_rows" in tensors else None
        if (
            ids.ndim != 1
            or not np.issubdtype(ids.dtype, np.integer)
            or (rows is not None and len(ids) != rows)
        ):
            raise LocalpersError(
                f"tensor 'U_ids' has shape {tuple(ids.shape)}, one token id per row of U_rows"
            )
        if len(ids) and ids.min() < 0:
            raise LocalpersError("tensor 'U_ids' holds a negative token id")


def _read_head_file(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises several types for a bad file
        raise LocalpersError(f"{path}: not a readable head file ({exc}); re-pull the bundle") from exc


# The tensors each kind of head (`HeadConfig.u`) is built from.
HEAD_TENSORS = {
    "factored": ("P", "default_vectors", "Q"),
    "full": ("P", "default_vectors", "U_ids", "U_rows"),
}


def check_head_file(path: Path, config: HeadConfig, *, n_embd: int | None, clusters: int | None) -> None:
    """Refuse (one line naming `path`) a head file that cannot serve `config` on a backbone `n_embd` wide, with
    a default vector for each of `clusters` clusters and the global one, without building the head: for
    checking a bundle (`pull`, `bundle verify`) where no backbone is loaded."""
    tensors = _read_head_file(path)
    needed = HEAD_TENSORS.get(config.u)
    if needed is None:
        raise LocalpersError(
            f"bundle manifest field 'head.u' is {config.u!r}, not one of {', '.join(HEAD_TENSORS)}"
        )
    missing = [name for name in needed if name not in tensors]
    try:
        if missing:
            raise LocalpersError(f"missing tensor {missing[0]!r}")
        _check_tensors(tensors, config, n_embd)
        rows = tensors["default_vectors"].shape[0]
        if clusters is not None and rows != clusters + 1:
            raise LocalpersError(
                f"tensor 'default_vectors' has {rows} rows; {clusters} clusters need {clusters + 1}"
                " (one per cluster, then the global default)"
            )
    except LocalpersError as exc:
        raise LocalpersError(f"{path}: {exc}; re-pull the bundle") from exc


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
        tensors = _read_head_file(path)
        try:
            _check_tensors(tensors, config, None if embeddings is None else embeddings.n_embd)
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
            raise LocalpersError(f"{path}: missing tensor {exc}; re-pull the bundle") from exc
        except LocalpersError as exc:
            raise LocalpersError(f"{path}: {exc}; re-pull the bundle") from exc

    def save(self, path: Path) -> Path:
        from safetensors.numpy import save_file

        tensors: dict[str, np.ndarray] = {"P": self.P, "default_vectors": self.default_vectors}
        if self.Q is not None:
            tensors["Q"] = self.Q
        if self.U_rows is not None and self.U_ids is not None:
            tensors["U_rows"] = self.U_rows
            tensors["U_ids"] = self.U_ids
        path = Path(path)
        partial = path.with_name(path.name + ".partial")
        save_file(tensors, str(partial))
        os.replace(partial, path)
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
