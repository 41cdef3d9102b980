"""Read GGUF LoRA adapters back into arrays, and stack two adapters into one file llama.cpp can load.

The engine activates one adapter at a time, but CoPe's user model is `backbone + cluster LoRA + user
LoRA`. LoRA updates add up, so both fit in one adapter of the summed rank: per weight,
`A = [A1; A2]` and `B = [s1 B1, s2 B2]` with each adapter's scale `s = alpha / rank` folded into B.
The file is written with `adapter.lora.alpha = 0`, which llama.cpp reads as "scale 1, do not divide
by the rank", so the stacked adapter computes exactly `W + s1 B1 A1 + s2 B2 A2`.
This module reads and writes files only; it trains nothing and loads nothing into an engine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localpers.engine.adapters import write_lora_gguf
from localpers.errors import LocalpersError

Tensors = dict[str, tuple[np.ndarray, np.ndarray]]  # gguf weight name -> (A (r, in), B (out, r))


@dataclass
class LoraFile:
    """An adapter's tensors and LoRA alpha as read from a GGUF file."""

    tensors: Tensors
    alpha: float
    architecture: str

    def scaled(self) -> Tensors:
        """Tensors with the scale folded into B: the update of each weight is then exactly `B @ A`."""
        out: Tensors = {}
        for name, (lora_a, lora_b) in self.tensors.items():
            rank = lora_a.shape[0]
            scale = self.alpha / rank if self.alpha else 1.0
            out[name] = (lora_a.astype(np.float32), lora_b.astype(np.float32) * np.float32(scale))
        return out

    @property
    def rank(self) -> int:
        return max((a.shape[0] for a, _ in self.tensors.values()), default=0)


def read_lora_gguf(path: Path) -> LoraFile:
    """The LoRA tensors of a GGUF adapter written by `localpers.engine.adapters.write_lora_gguf` (or llama.cpp's tools)."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except (OSError, ValueError) as exc:
        raise LocalpersError(f"{path}: not a readable GGUF adapter ({exc})") from None

    def field_value(key: str) -> object:
        field = reader.fields.get(key)
        if field is None:
            return None
        value = field.parts[field.data[0]]
        return (
            bytes(value).decode() if field.types and field.types[0] == gguf.GGUFValueType.STRING else value[0]
        )

    if field_value("general.type") != "adapter" or field_value("adapter.type") != "lora":
        raise LocalpersError(f"{path} is a GGUF file but not a LoRA adapter")
    halves: dict[str, dict[str, np.ndarray]] = {}
    for tensor in reader.tensors:
        weight, _, which = tensor.name.rpartition(".")
        if which not in ("lora_a", "lora_b"):
            raise LocalpersError(f"{path}: unexpected tensor {tensor.name!r} in a LoRA adapter")
        # GGUF lists dimensions innermost first; numpy wants them outermost first.
        shape = tuple(int(n) for n in reversed(tensor.shape))
        halves.setdefault(weight, {})[which] = np.asarray(tensor.data, dtype=np.float32).reshape(shape)
    broken = [name for name, pair in halves.items() if set(pair) != {"lora_a", "lora_b"}]
    if broken:
        raise LocalpersError(f"{path}: {broken[0]} lacks its lora_a or lora_b tensor")
    tensors = {name: (pair["lora_a"], pair["lora_b"]) for name, pair in halves.items()}
    for name, (a, b) in tensors.items():  # what stacking and llama.cpp need: B (out, r) after A (r, in)
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
            raise LocalpersError(f"{path}: {name}'s lora_a {a.shape} and lora_b {b.shape} do not pair up")
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
            raise LocalpersError(f"{path}: {name} holds numbers that are not finite")
    alpha = field_value("adapter.lora.alpha")
    if alpha is not None and not math.isfinite(float(alpha)):
        raise LocalpersError(f"{path}: its LoRA alpha is not a finite number")
    architecture = field_value("general.architecture")
    return LoraFile(tensors, float(alpha or 0.0), str(architecture or "gemma3"))


def stack_loras(adapters: Sequence[LoraFile]) -> Tensors:
    """One adapter whose update is the sum of `adapters`' updates (write it with alpha = 0)."""
    stacked: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for adapter in adapters:
        for name, pair in adapter.scaled().items():
            earlier = stacked.get(name)
            if earlier and (earlier[0][0].shape[1], earlier[0][1].shape[0]) != (
                pair[0].shape[1],
                pair[1].shape[0],
            ):
                raise LocalpersError(
                    f"LoRA weight {name} of one adapter is {pair[1].shape[0]}x{pair[0].shape[1]}, of another"
                    f" {earlier[0][1].shape[0]}x{earlier[0][0].shape[1]}: the adapters are for different models"
                )
            stacked.setdefault(name, []).append(pair)
    return {
        name: (np.concatenate([a for a, _ in pairs], axis=0), np.concatenate([b for _, b in pairs], axis=1))
        for name, pairs in stacked.items()
    }


def write_stacked_lora(
    path: Path, adapters: Sequence[LoraFile], *, name: str = "stacked", private: bool = False
) -> Path:
    """Write the sum of `adapters` as one GGUF adapter at `path` (atomically; `private`: 0600, a user's)."""
    if not adapters:
        raise ValueError("nothing to stack")
    return write_lora_gguf(
        path,
        stack_loras(adapters),
        alpha=0.0,
        architecture=adapters[0].architecture,
        name=name,
        private=private,
    )
