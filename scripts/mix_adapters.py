"""Write one GGUF LoRA adapter whose update is a weighted sum of others, for benchmarking mixes.

With n adapters of the same rank r and alpha, the mix's update is `sum_i w_i * (alpha / r) * B_i @ A_i`. It is
stored exactly, as one adapter of rank n * r: `A = [A_1; ...; A_n]`, `B = [w_1 * B_1, ..., w_n * B_n]` and alpha
n * alpha, so that llama.cpp's scale alpha / rank is unchanged. This is what llama.cpp computes when all of them
are active at once with scales w_i, in one file that `scripts/swap_adapter.py` can put into a bundle.

    python scripts/mix_adapters.py /tmp/mix/cluster-0.gguf A/global.gguf C/cluster-0.gguf --weights 0.5,0.5

For experiments only; the device does not read mixed adapters in any special way.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from localpers.engine.adapters import backbone_architecture, write_lora_gguf


def read_lora(path: Path) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], float]:
    """`({weight: (A, B)}, alpha)` of a GGUF LoRA adapter."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    alpha_field = reader.fields["adapter.lora.alpha"]
    alpha = float(alpha_field.parts[alpha_field.data[0]][0])
    halves: dict[str, dict[str, np.ndarray]] = {}
    for tensor in reader.tensors:
        weight, _, which = tensor.name.rpartition(".")
        halves.setdefault(weight, {})[which] = np.array(tensor.data, dtype=np.float32)
    pairs = {weight: (ab["lora_a"], ab["lora_b"]) for weight, ab in halves.items()}
    return pairs, alpha


def mix(
    adapters: list[dict[str, tuple[np.ndarray, np.ndarray]]], weights: list[float]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The rank-concatenated pairs whose `B @ A` is `sum_i w_i B_i A_i`."""
    first = adapters[0]
    if any(set(other) != set(first) for other in adapters[1:]):
        raise SystemExit("the adapters adapt different weights; they cannot be mixed")
    mixed = {}
    for weight, (a1, b1) in first.items():
        pairs = [adapter[weight] for adapter in adapters]
        if any(a.shape != a1.shape or b.shape != b1.shape for a, b in pairs):
            raise SystemExit(f"{weight}: shapes differ between adapters; mix adapters of one rank")
        mixed[weight] = (
            np.concatenate([a for a, _ in pairs], axis=0),
            np.concatenate([w * b for w, (_, b) in zip(weights, pairs, strict=True)], axis=1),
        )
    return mixed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the mixed adapter to write")
    parser.add_argument("adapters", type=Path, nargs="+", help="GGUF LoRA adapters of one rank and alpha")
    parser.add_argument("--weights", required=True, help="w_1,...,w_n, one per adapter")
    args = parser.parse_args()
    weights = [float(part) for part in args.weights.split(",")]
    if len(weights) != len(args.adapters):
        raise SystemExit(f"{len(args.adapters)} adapters but {len(weights)} weights")
    read = [read_lora(path) for path in args.adapters]
    alphas = {alpha for _, alpha in read}
    if len(alphas) != 1:
        raise SystemExit(f"alphas differ ({sorted(alphas)}); mix adapters trained with one alpha")
    write_lora_gguf(
        args.out,
        mix([pairs for pairs, _ in read], weights),
        alpha=len(read) * alphas.pop(),
        architecture=backbone_architecture(args.adapters[0]),
        name="localpers-mix",
    )
    terms = " + ".join(f"{w} x {path.name}" for w, path in zip(weights, args.adapters, strict=True))
    print(f"{args.out}: {terms}")


if __name__ == "__main__":
    main()
