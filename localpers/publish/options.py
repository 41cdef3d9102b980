"""Every knob of `localpers publish`, in one frozen dataclass with the defaults used for the demo bundle.

Each stage names the fields it depends on (`stage_fields`), so changing an option re-runs only the
stages it affects (and the ones after them). This module holds no logic beyond that bookkeeping and refusing
options that contradict each other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from localpers.engine.lora_targets import DEFAULT_TARGETS
from localpers.errors import InputError

STAGES: tuple[str, ...] = ("clusters", "sft", "export", "pairs", "features", "head", "bundle")


@dataclass(frozen=True)
class PublishOptions:
    """Options of one publisher run (CLI flags map 1:1 onto these fields)."""

    corpus: Path
    out: Path
    work: Path | None = None  # stage cache; default OUT/.work
    model: str | None = None  # backbone GGUF; default: resolve_backbone()
    task: str = "headline"
    seed: int = 0
    # execution (not part of any stage's cache key: every executor computes the same outputs)
    executor: str = "sequential"  # "sequential" (this process) or "ray" (the CLI's default)
    ray_address: str | None = None  # None = start a local Ray; else an existing cluster's address
    workers: int | None = None  # CPUs of a local Ray (default: all cores)
    shard_users: int = 8  # authors per pairs/features/embedding task
    task_retries: int = 3  # Ray re-runs a task whose worker died this many times
    gpus_per_task: float | None = None  # GPUs per SFT task; None = 1 when the Ray cluster has GPUs
    task_memory_gb: float = 4.0  # memory one SFT/export/head task declares (a pairs/features shard: half)
    # a. clusters
    k: int | None = None  # None = choose by silhouette over k_range
    k_range: tuple[int, int] = (2, 6)
    val_fraction: float = 0.1
    minibatch_above: int = 2000  # more users than this: MiniBatchKMeans and a sampled silhouette
    # b. SFT
    rank: int = 16
    lora_alpha: float = 32.0
    dropout: float = 0.05
    targets: tuple[str, ...] = DEFAULT_TARGETS
    lr: float = 2e-4
    batch_size: int = 8
    global_epochs: float = 1.0
    cluster_epochs: float = 1.0
    max_steps: int | None = None  # caps the steps of every adapter
    cluster_init: str = "global"  # "global" (start from the trained global adapter) or "fresh"
    max_seq_len: int = 256
    history_examples: int = (
        0  # > 0: history-conditioned prompts with this many past outputs (publish/prompts.py)
    )
    described_examples: int = (
        0  # of those, the closest this many shown with their content (history_prompt.py)
    )
    recent_examples: int = (
        0  # of those, this many are the author's most recent earlier outputs (the device's way)
    )
    example_pool: str = "earlier"  # sft prompts' examples: "earlier" items (the device's way) or all "others"
    precision: str = "auto"  # "auto" (measure), "bf16" or "fp32"
    checkpoint_every: int = 25
    threads: int = 2  # torch
    engine_threads: int = 2  # llama.cpp (1 can be faster on a CPU other jobs are using)
    # d. pairs
    # The adapter CARD's correction sits on, whose greedy outputs are the pairs' y-: "cluster", "global", or "auto"
    # (global for history-conditioned adapters, where it beat the cluster adapters on held-out train authors,
    # docs/RESULTS.md 0l; cluster for plain ones, as in the CARD paper). Recorded as the manifest's `head.base`.
    card_base: str = "auto"
    pairs_per_user: int | None = 30
    max_new_tokens: int = 32
    # f. head
    head_d: int = 128
    head_steps: int = 300
    head_lr: float = 5e-3
    head_weight_decay: float = 1e-2
    head_holdout: float = 0.2
    head_top_k: int = 20
    head_target_correction: float | None = 1.0  # calibrate alpha: mean |per-token correction| in logits
    length_normalised: bool = False
    head_author_negatives: int = 0  # extra pairs per pair: y- = a same-cluster author's own text
    head_u: str = "factored"  # "factored" (U = E Q) or "full" (a free row per token seen in the pairs)
    # g. bundle
    # the bundle's data card (None: the corpus file's name, and the licence "not stated")
    data_source: str | None = None
    data_licence: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.example_pool not in ("earlier", "others"):
            raise InputError(f"--example-pool {self.example_pool!r}: use 'earlier' or 'others'")
        for flag, count in (
            ("--described-examples", self.described_examples),
            ("--recent-examples", self.recent_examples),
        ):
            if count > self.history_examples:
                raise InputError(
                    f"{flag} {count} is more than --history-examples {self.history_examples}: they count examples"
                    " of the history-conditioned prompt; raise --history-examples or lower it"
                )

    @property
    def work_dir(self) -> Path:
        return self.work if self.work is not None else self.out / ".work"

    def as_dict(self) -> dict[str, Any]:
        return {
            key: (str(value) if isinstance(value, Path) else value) for key, value in asdict(self).items()
        }


# Which options each stage's output depends on (besides the outputs of earlier stages).
STAGE_FIELDS: dict[str, tuple[str, ...]] = {
    "clusters": ("k", "k_range", "val_fraction", "seed", "minibatch_above"),
    "sft": (
        "task",
        "rank",
        "lora_alpha",
        "dropout",
        "targets",
        "lr",
        "batch_size",
        "global_epochs",
        "cluster_epochs",
        "max_steps",
        "cluster_init",
        "max_seq_len",
        "history_examples",
        "described_examples",
        "recent_examples",
        "example_pool",
        "precision",
        "seed",
    ),
    "export": (),
    "pairs": (
        "pairs_per_user",
        "max_new_tokens",
        "task",
        "history_examples",
        "described_examples",
        "recent_examples",
        "card_base",
        "seed",
    ),
    "features": (),
    "head": (
        "head_d",
        "head_steps",
        "head_lr",
        "head_weight_decay",
        "head_holdout",
        "length_normalised",
        "head_author_negatives",
        "head_u",
        "head_target_correction",
        "head_top_k",
        "seed",
    ),
    "bundle": ("head_top_k", "data_source", "data_licence"),
}


# Fields added after bundles were published: left out of the key at their default, so old caches stay valid.
KEY_ONLY_IF_CHANGED: dict[str, Any] = {
    "minibatch_above": 2000,
    "recent_examples": 0,
    "example_pool": "earlier",
}


def stage_fields(options: PublishOptions, stage: str) -> dict[str, Any]:
    values = options.as_dict()
    # keyed as "auto" whenever it names what auto would choose: the same base made a needless new pairs stage
    if values.get("card_base") == card_base(replace(options, card_base="auto")):
        values["card_base"] = "auto"
    return {
        name: values[name]
        for name in STAGE_FIELDS[stage]
        if name not in KEY_ONLY_IF_CHANGED or values[name] != KEY_ONLY_IF_CHANGED[name]
    }


def card_base(options: PublishOptions) -> str:
    """The adapter CARD corrects in the bundle `options` publish: `card_base`, with "auto" resolved."""
    if options.card_base != "auto":
        return options.card_base
    return "global" if options.history_examples > 0 else "cluster"
