"""PNG plots for the bundle: SFT training loss per adapter and head pair accuracy. Matplotlib, Agg backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from localpers.plotting import pyplot


def smooth(values: list[float], window: int) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if window <= 1 or len(array) < window:
        return array
    return np.convolve(array, np.ones(window) / window, mode="valid")


def plot_sft_losses(path: Path, train_loss: dict[str, list[float]], adapters: dict[str, Any]) -> Path:
    plt = pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, losses in train_loss.items():
        window = max(1, len(losses) // 20)
        left.plot(np.arange(len(smooth(losses, window))) + window, smooth(losses, window), label=name)
    left.set_xlabel("step")
    left.set_ylabel("train loss (moving average)")
    left.set_title("SFT training loss per adapter")
    left.legend(fontsize=8)
    names = list(adapters)
    x = np.arange(len(names))
    right.bar(x - 0.27, [adapters[n]["val_loss_backbone"] for n in names], 0.27, label="backbone")
    right.bar(x, [adapters[n]["val_loss_init"] for n in names], 0.27, label="start")
    right.bar(x + 0.27, [adapters[n]["val_loss"] for n in names], 0.27, label="trained")
    right.set_xticks(x, names, rotation=20)
    right.set_ylabel("validation loss / target token")
    right.set_title("held-out items of each adapter's users")
    right.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


def plot_head(path: Path, curve: list[dict[str, float]], accuracy: dict[str, float]) -> Path:
    plt = pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [p["step"] for p in curve]
    left.plot(steps, [p["train_loss"] for p in curve], label="train BT loss")
    left.set_xlabel("step")
    left.set_ylabel("loss")
    left.legend(fontsize=8, loc="upper right")
    twin = left.twinx()
    twin.plot(steps, [p["train_accuracy"] for p in curve], color="tab:green", label="train accuracy")
    twin.plot(steps, [p["heldout_accuracy_own"] for p in curve], color="tab:red", label="held-out accuracy")
    twin.set_ylabel("pair accuracy")
    twin.legend(fontsize=8, loc="center right")
    left.set_title("head training")
    names = [n for n in accuracy if not n.startswith("train")]
    right.bar(names, [accuracy[n] for n in names], color="tab:blue")
    right.axhline(0.5, color="grey", linestyle="--", linewidth=1)
    right.set_ylim(0, 1)
    right.set_ylabel("held-out pair accuracy  R(y+) > R(y-)")
    right.set_title("which user vector")
    right.tick_params(axis="x", rotation=15)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path
