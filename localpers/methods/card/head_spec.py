"""What a bundle's CARD head must be: its manifest fields (`HeadConfig`) and its file's tensors.

`HeadConfig.from_manifest` reads the manifest's `head` entry and refuses values no head can serve (sizes, tapped
layers, top-k and scales out of range; `check_backbone` the layers a backbone lacks). `check_head_tensors` refuses
a head file's tensors that cannot serve a config (shapes, non-finite values, token ids), for `CardHead.load` and,
with `check_head_file`, for checking a bundle without building the head (`localpers.methods.card.bundle_content`).
This module reads and checks; the head's maths is `localpers.methods.card.head`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localpers.errors import LocalpersError
from localpers.methods.bounds import MAX_D, MAX_STRENGTH, MAX_TOP_K

BASES = ("cluster", "global")  # the adapters CARD's correction can sit on (`HeadConfig.base`)
LAYER_NORMS = ("rms",)  # how the device normalises the tapped states (`head.normalise_features`)
# What a manifest's head may ask for: its top-k `bounds.MAX_TOP_K`, its alpha and strength `bounds.MAX_STRENGTH`.
# The strength (alpha without one) is what a fit stores for the vector, and a stored strength over MAX_STRENGTH
# is damaged, so a larger one gave fits every rewrite refused. Calibrated scales are well under 1 (the demo
# bundle's alpha: 0.066).


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
        # bool("false") is True: a flag written as a string divided every g(y) by its length without a word
        flag = entry.get("length_normalised", False)
        if not isinstance(flag, bool):
            raise LocalpersError(
                f"bundle manifest field 'head.length_normalised' is {flag!r}; it must be true or false"
            )
        try:
            config = cls(
                d=int(entry["d"]),
                layers=tuple(int(x) for x in entry["layers"]),
                u=str(entry.get("u", "factored")),
                alpha=float(entry.get("alpha", 1.0)),
                top_k=int(entry.get("top_k", 20)),
                length_normalised=flag,
                layer_norm=str(entry.get("layer_norm", "rms")),
                strength=None if entry.get("strength") is None else float(entry["strength"]),
                base=str(entry.get("base", "cluster")),
            )
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise LocalpersError(f"bundle manifest field 'head' is malformed ({exc})") from exc
        if config.base not in BASES:
            raise LocalpersError(
                f"bundle manifest field 'head.base' is {config.base!r}, not one of {', '.join(BASES)} (a newer"
                " localpers may read it)"
            )
        if config.layer_norm not in LAYER_NORMS:
            raise LocalpersError(
                f"bundle manifest field 'head.layer_norm' is {config.layer_norm!r}; this localpers normalises the"
                f" tapped states only as {', '.join(LAYER_NORMS)} (a newer localpers may read it)"
            )
        problem = config._out_of_range()
        if problem:
            raise LocalpersError(f"bundle manifest field 'head.{problem}")
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
                math.isfinite(self.alpha) and 0 <= self.alpha <= MAX_STRENGTH,
                f"be from 0 to {MAX_STRENGTH:g}",
            ),
            (
                "strength",
                self.strength,
                self.strength is None
                or (math.isfinite(self.strength) and 0 <= self.strength <= MAX_STRENGTH),
                f"be from 0 to {MAX_STRENGTH:g}",
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
                f" {n_layer} (0-{n_layer - 1}); the bundle was published for another backbone"
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


def check_head_tensors(tensors: dict[str, np.ndarray], config: HeadConfig, n_embd: int | None) -> None:
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


def read_head_file(path: Path) -> dict[str, np.ndarray]:
    """The head file's tensors, or a one-line error naming it."""
    from safetensors.numpy import load_file

    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises several types for a bad file
        raise LocalpersError(f"{path}: not a readable head file ({exc})") from exc


# The tensors each kind of head (`HeadConfig.u`) is built from.
HEAD_TENSORS = {
    "factored": ("P", "default_vectors", "Q"),
    "full": ("P", "default_vectors", "U_ids", "U_rows"),
}


def check_head_file(path: Path, config: HeadConfig, *, n_embd: int | None, clusters: int | None) -> None:
    """Refuse (one line naming `path`) a head file that cannot serve `config` on a backbone `n_embd` wide, with
    a default vector for each of `clusters` clusters and the global one, without building the head: for
    checking a bundle (`pull`, `bundle verify`) where no backbone is loaded."""
    tensors = read_head_file(path)
    needed = HEAD_TENSORS.get(config.u)
    if needed is None:
        raise LocalpersError(
            f"bundle manifest field 'head.u' is {config.u!r}, not one of {', '.join(HEAD_TENSORS)}"
        )
    missing = [name for name in needed if name not in tensors]
    try:
        if missing:
            raise LocalpersError(f"missing tensor {missing[0]!r}")
        check_head_tensors(tensors, config, n_embd)
        rows = tensors["default_vectors"].shape[0]
        if clusters is not None and rows != clusters + 1:
            raise LocalpersError(
                f"tensor 'default_vectors' has {rows} rows; {clusters} clusters need {clusters + 1}"
                " (one per cluster, then the global default)"
            )
    except LocalpersError as exc:
        raise LocalpersError(f"{path}: {exc}") from exc
