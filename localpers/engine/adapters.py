"""Write LoRA adapters as GGUF files that llama.cpp loads (with the `gguf` package, a base dependency).

An adapter is a mapping from a backbone weight's GGUF name (`blk.3.attn_q.weight`) to the pair
`(A, B)` with `A` of shape `(rank, in_features)` and `B` of shape `(out_features, rank)`, the
layout peft uses; the update is `W + (alpha / rank) * B @ A`. Tensors are stored in f16. The backbone's
architecture and block weight shapes come from its header (`gguf_layout`). `check_lora_adapter` refuses,
from headers and data alone, an adapter file llama.cpp would refuse or whose non-finite weights it would load
(every output then random tokens).
This module does not train anything and does not load adapters (see `localpers.engine`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from localpers.atomic import TEMP_SUFFIX, remove_stale_temp_files
from localpers.engine.gguf_layout import GGUFLayout, gguf_layout, map_tensor
from localpers.engine.lora_targets import DEFAULT_TARGETS
from localpers.errors import LocalpersError


def _gguf():
    try:
        import gguf
    except ImportError as exc:
        raise LocalpersError(
            "writing adapters needs the gguf package (a localpers dependency): pip install gguf"
        ) from exc
    return gguf


def backbone_architecture(backbone: Path) -> str:
    """The `general.architecture` of a GGUF file (for example `gemma3`)."""
    return gguf_layout(Path(backbone)).architecture


def linear_shapes(backbone: Path, targets: Iterable[str] = DEFAULT_TARGETS) -> dict[str, tuple[int, int]]:
    """`{gguf weight name: (in_features, out_features)}` for the targeted 2-D block weights of a backbone."""
    wanted = tuple(targets)
    shapes: dict[str, tuple[int, int]] = {}
    for tensor in gguf_layout(Path(backbone)).tensors:
        parts = tensor.name.split(".")
        block_weight = (
            len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" and len(tensor.shape) == 2
        )
        if block_weight and parts[2] in wanted:
            shapes[tensor.name] = (tensor.shape[0], tensor.shape[1])
    return shapes


def write_lora_gguf(
    path: Path,
    tensors: Mapping[str, tuple[np.ndarray, np.ndarray]],
    *,
    alpha: float,
    architecture: str = "gemma3",
    name: str = "localpers-adapter",
    private: bool = False,
) -> Path:
    """Write `tensors` as a GGUF LoRA adapter at `path` atomically (temp file, fsync, rename).

    The temp file carries this process's id, so one left by a killed writer is swept by the next atomic write
    of that file (`localpers.atomic.remove_stale_temp_files`); one left by an error is removed at once.
    `private` keeps the file to its owner (0600, as every file in a user's folder); else it is 0644 like any
    published file.
    """
    gguf = _gguf()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_files(path)
    fd, partial_name = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=TEMP_SUFFIX
    )  # created 0600
    os.close(fd)
    partial = Path(partial_name)
    try:
        if not private:
            os.chmod(partial, 0o644)
        writer = gguf.GGUFWriter(str(partial), architecture)
        writer.add_string("general.type", "adapter")
        writer.add_string("general.name", name)
        writer.add_string("adapter.type", "lora")
        writer.add_float32("adapter.lora.alpha", float(alpha))
        for weight_name in sorted(tensors):
            lora_a, lora_b = tensors[weight_name]
            if lora_a.ndim != 2 or lora_b.ndim != 2 or lora_a.shape[0] != lora_b.shape[1]:
                raise ValueError(f"{weight_name}: A {lora_a.shape} and B {lora_b.shape} do not share a rank")
            writer.add_tensor(weight_name + ".lora_a", np.ascontiguousarray(lora_a, dtype=np.float16))
            writer.add_tensor(weight_name + ".lora_b", np.ascontiguousarray(lora_b, dtype=np.float16))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with open(partial, "rb") as written:
            os.fsync(written.fileno())
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise
    return path


def random_lora(
    backbone: Path,
    path: Path,
    *,
    rank: int = 4,
    std: float = 0.02,
    seed: int = 0,
    targets: Iterable[str] = ("attn_q", "attn_v", "ffn_up"),
) -> Path:
    """A random adapter for tests and benchmarks: both factors non-zero so it changes the logits."""
    rng = np.random.default_rng(seed)
    tensors = {
        weight: (
            rng.normal(0.0, std, size=(rank, n_in)).astype(np.float32),
            rng.normal(0.0, std, size=(n_out, rank)).astype(np.float32),
        )
        for weight, (n_in, n_out) in linear_shapes(backbone, targets).items()
    }
    return write_lora_gguf(
        path, tensors, alpha=2.0 * rank, architecture=backbone_architecture(backbone), name=f"random-{seed}"
    )


def check_lora_adapter(path: Path, backbone: GGUFLayout) -> None:
    """Refuse (one line naming `path`) a LoRA file that does not fit the backbone (its header: `gguf_layout`)
    or holds non-finite numbers.

    The checks are llama.cpp's own when it loads an adapter (GGUF type `adapter`/`lora`, the backbone's
    architecture, an A and a B of matching rank for weights the backbone has, with its in/out sizes), so a
    file that passes loads; plus what llama.cpp does not check: a finite alpha and finite F16/F32 weights.
    """
    path, base = Path(path), backbone
    layout = gguf_layout(path)

    def refuse(problem: str) -> LocalpersError:
        return LocalpersError(f"{path}: {problem}")

    kinds = (layout.values.get("general.type"), layout.values.get("adapter.type"))
    if kinds != ("adapter", "lora"):
        raise refuse(f"not a LoRA adapter (general.type, adapter.type = {kinds[0]!r}, {kinds[1]!r})")
    if layout.architecture != base.architecture:
        raise refuse(f"an adapter for {layout.architecture!r}, the backbone is {base.architecture!r}")
    alpha = layout.values.get("adapter.lora.alpha", 0.0)
    if not isinstance(alpha, int | float) or not np.isfinite(alpha):
        raise refuse(f"adapter.lora.alpha is {alpha!r}, not a finite number")
    pairs: dict[str, dict[str, object]] = {}
    for tensor in layout.tensors:
        weight, _, part = tensor.name.rpartition(".")
        if part not in ("lora_a", "lora_b"):
            raise refuse(f"tensor {tensor.name!r} is neither a LoRA A nor a B")
        pairs.setdefault(weight, {})[part] = tensor
    if not pairs:
        raise refuse("holds no LoRA tensors")
    for weight, pair in sorted(pairs.items()):
        target = base.tensor(weight)
        if target is None or len(target.shape) != 2:
            raise refuse(f"adapts {weight!r}, which the backbone has no matrix of")
        if len(pair) != 2:
            raise refuse(f"{weight!r} has only its {next(iter(pair))}")
        a, b = pair["lora_a"], pair["lora_b"]
        ranks_agree = len(a.shape) == 2 and len(b.shape) == 2 and a.shape[1] == b.shape[0]
        if not ranks_agree or a.shape[0] != target.shape[0] or b.shape[1] != target.shape[1]:
            raise refuse(
                f"{weight!r} has A {a.shape} and B {b.shape}; the backbone's {target.shape} needs"
                f" ({target.shape[0]}, r) and (r, {target.shape[1]})"
            )
        for tensor in (a, b):
            data = map_tensor(path, tensor)
            if data.dtype.kind == "f" and not np.isfinite(data).all():
                raise refuse(f"tensor {tensor.name!r} holds values that are not finite numbers")
