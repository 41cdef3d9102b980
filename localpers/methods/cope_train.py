"""CoPe's per-user LoRA: supervised fine-tuning on the user's history, on the device, with torch + peft.

What it trains on (`training_examples`): each history item's prompt, plain or history-conditioned on
the items before it, tokenised by the device's engine, followed by the user's output.
The base model is the GGUF backbone (dequantised to fp32 by `transformers`) with the base adapter
(`fit_cope` picks it: the bundle's `head.base`) merged into its weights; a fresh LoRA on top of it is trained with
cross-entropy on the output tokens only (the LM head is applied at target positions only: the
262,144-token vocabulary would otherwise dominate the cost). The trained LoRA is returned as GGUF
tensors (`{blk.N.attn_q.weight: (A, B)}`) for `localpers.engine.adapters.write_lora_gguf`.

The backbone is loaded once per process (about 40 s) and wrapped with peft once, through the
publisher's `localpers.engine.torch_model` (shared with it: batches, target-only losses, LoRA state);
every user's fit resets the LoRA weights and merges, then unmerges, its base adapter. Needs the `[publish]` extra
(torch, transformers, peft, gguf). It writes no files and does not decode (see `localpers.methods.cope` and `cope_decode`).
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from localpers.engine import Engine
from localpers.engine.torch_model import (
    Example,
    cpu_has_bf16,
    fresh_lora_state,
    load_lora_state,
    lora_state,
    make_batch,
    shared_lora_model,
    target_token_losses,
)
from localpers.errors import PUBLISH_EXTRA_HINT, LocalpersError
from localpers.methods.lora_files import LoraFile, Tensors
from localpers.tasks import get_task
from localpers.users.history import HistoryItem
from localpers.users.history_prompt import PromptFormat, conditioned_prompt

# GGUF block weight -> (transformers submodule, peft target name)
GGUF_TO_TORCH = {
    "attn_q": ("self_attn", "q_proj"),
    "attn_k": ("self_attn", "k_proj"),
    "attn_v": ("self_attn", "v_proj"),
    "attn_output": ("self_attn", "o_proj"),
    "ffn_gate": ("mlp", "gate_proj"),
    "ffn_up": ("mlp", "up_proj"),
    "ffn_down": ("mlp", "down_proj"),
}
_TORCH_TO_GGUF = {proj: gguf for gguf, (_, proj) in GGUF_TO_TORCH.items()}
_GGUF_WEIGHT = re.compile(r"blk\.(\d+)\.(\w+)\.weight")
_PEFT_KEY = re.compile(r"(?:.*\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
PAD_MULTIPLE = 16

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class SftConfig:
    """How the user LoRA is trained. Defaults: small and short, for a CPU and a ~20-100 item history."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.05
    targets: tuple[str, ...] = tuple(GGUF_TO_TORCH)
    epochs: float = 3.0
    max_steps: int | None = None
    batch_size: int = 4
    learning_rate: float = 2e-4
    max_seq_len: int = 256
    seed: int = 0
    threads: int | None = None
    precision: str = "auto"  # "auto" (bf16 when the CPU has it), "bf16" or "fp32"


@dataclass
class SftResult:
    tensors: Tensors
    steps: int
    tokens: int
    losses: list[float]
    precision: str
    seconds: dict[str, float] = field(default_factory=dict)


def _require_training_extra() -> None:
    try:
        import peft  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise LocalpersError(
            f"CoPe trains a LoRA on this machine and needs the publish extra ({exc.name} is missing): "
            + PUBLISH_EXTRA_HINT
        ) from None


def lora_model(backbone: Path, config: SftConfig) -> Any:
    """The peft-wrapped fp32 backbone for `config`'s LoRA shape: the publisher's per-process shared model."""
    _require_training_extra()
    return shared_lora_model(
        backbone, config.rank, config.alpha, config.dropout, config.targets, seed=config.seed
    )


def _reset_lora(model: Any, backbone: Path, config: SftConfig) -> None:
    load_lora_state(
        model,
        fresh_lora_state(
            backbone, config.rank, config.alpha, config.dropout, config.targets, seed=config.seed
        ),
    )


def _linear(model: Any, layer: int, gguf_kind: str) -> Any:
    """The frozen `nn.Linear` of block `layer` that a GGUF weight name refers to (under peft's wrapper)."""
    causal_lm = model.get_base_model()
    group, projection = GGUF_TO_TORCH[gguf_kind]
    module = getattr(getattr(causal_lm.model.layers[layer], group), projection)
    return getattr(module, "base_layer", module)


@contextlib.contextmanager
def merged(model: Any, adapter: LoraFile | None) -> Iterator[None]:
    """Add `adapter`'s update to the backbone weights for the duration of the block, then remove it."""
    if adapter is None:
        yield
        return
    import torch

    deltas = []
    for name, (lora_a, lora_b) in adapter.scaled().items():
        match = _GGUF_WEIGHT.fullmatch(name)
        if match is None or match.group(2) not in GGUF_TO_TORCH:
            raise LocalpersError(f"base adapter tensor {name!r} is not a block weight this trainer knows")
        linear = _linear(model, int(match.group(1)), match.group(2))
        delta = torch.from_numpy(lora_b @ lora_a)
        if tuple(delta.shape) != tuple(linear.weight.shape):
            raise LocalpersError(
                f"base adapter {name}: update {tuple(delta.shape)} does not fit weight {tuple(linear.weight.shape)}"
            )
        deltas.append((linear, delta))
    # restored from copies, not by subtracting: in float32 (w + d) - d is not w, so each fit left the backbone
    # this process shares (the next user's fit, the publisher's training) slightly changed
    saved = [linear.weight.detach().clone() for linear, _ in deltas]
    try:
        with torch.no_grad():
            for linear, delta in deltas:
                linear.weight += delta
        yield
    finally:
        with torch.no_grad():
            for (linear, _), original in zip(deltas, saved, strict=True):
                linear.weight.copy_(original)


def train_user_lora(
    backbone: Path,
    examples: Sequence[Example],
    base_adapter: LoraFile | None,
    config: SftConfig | None = None,
    progress: Progress | None = None,
) -> SftResult:
    """Fit a fresh LoRA to `examples` on top of `backbone + base_adapter`; returns its GGUF tensors."""
    config = config or SftConfig()
    if not examples:
        raise LocalpersError("CoPe needs at least one history item to train on")
    _require_training_extra()  # one line naming what to install, not torch's import traceback
    import torch

    seconds: dict[str, float] = {}
    started = time.perf_counter()
    if progress:
        progress("load", 0, 1)
    model = lora_model(backbone, config)
    seconds["load"] = time.perf_counter() - started
    if progress:
        progress("load", 1, 1)
    if config.threads:
        torch.set_num_threads(config.threads)
    precision = config.precision
    if precision == "auto":
        precision = "bf16" if cpu_has_bf16() else "fp32"
    steps = max(1, math.ceil(config.epochs * len(examples) / config.batch_size))
    if config.max_steps:
        steps = min(steps, config.max_steps)
    rng = np.random.default_rng(config.seed)
    order: list[int] = []
    while len(order) < steps * config.batch_size:
        order.extend(int(i) for i in rng.permutation(len(examples)))

    started = time.perf_counter()
    _reset_lora(model, backbone, config)
    torch.manual_seed(config.seed)
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=config.learning_rate, weight_decay=0.0)
    warmup = max(1, steps // 10)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) * (1.0 - 0.9 * step / max(1, steps))
    )
    losses: list[float] = []
    tokens = 0
    autocast = (
        torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    )
    with merged(model, base_adapter):
        model.train()
        for step in range(steps):
            batch = make_batch(
                [examples[i] for i in order[step * config.batch_size : (step + 1) * config.batch_size]]
            )
            with autocast:
                loss = target_token_losses(model, batch).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(parameters, 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(round(float(loss.detach()), 4))
            tokens += batch["n_tokens"]
            if progress:
                progress("train", step + 1, steps)
        model.eval()
    seconds["train"] = time.perf_counter() - started
    return SftResult(
        tensors=gguf_tensors(lora_state(model)),
        steps=steps,
        tokens=tokens,
        losses=losses,
        precision=precision,
        seconds=seconds,
    )


def gguf_tensors(state: dict[str, Any]) -> Tensors:
    """`{blk.N.<kind>.weight: (A (r, in), B (out, r))}` from a peft LoRA state dict."""
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key, tensor in state.items():
        match = _PEFT_KEY.match(key)
        if match is None or match.group(2) not in _TORCH_TO_GGUF:
            raise LocalpersError(f"unexpected LoRA tensor {key!r}; cannot map it to a GGUF weight name")
        layer, projection, which = match.groups()
        name = f"blk.{layer}.{_TORCH_TO_GGUF[projection]}.weight"
        pairs.setdefault(name, {})[which] = tensor.detach().float().numpy()
    return {name: (ab["A"], ab["B"]) for name, ab in pairs.items()}


def training_prompts(items: Sequence[HistoryItem], prompt_format: PromptFormat | None) -> list[str]:
    """Each item's prompt: plain, or conditioned on the user's items before it (what the device had then)."""
    prompts = []
    for index, item in enumerate(items):
        task = get_task(item.task)
        if prompt_format is None:
            prompts.append(task.prompt_for(item.input))
            continue
        earlier = [(e.input, e.output) for e in items[:index] if e.task == item.task]
        prompts.append(conditioned_prompt(task, item.input, earlier, prompt_format))
    return prompts


def training_examples(
    engine: Engine,
    items: Sequence[HistoryItem],
    max_seq_len: int,
    prompt_format: PromptFormat | None = None,
) -> list[Example]:
    """BOS + the item's prompt (`training_prompts`), then `" " + output + "\\n"`.

    That is what the device prefills and then generates; a prompt too long for `max_seq_len` loses its start.
    """
    examples = []
    for item, text in zip(items, training_prompts(items, prompt_format), strict=True):
        prompt = engine.tokenize(text, add_bos=True)
        target = engine.tokenize(" " + item.output.strip() + "\n", add_bos=False)[: max_seq_len // 2]
        room = max_seq_len - len(target)
        if len(prompt) > room:  # keep BOS and the end of the prompt, where the answer cue is
            prompt = prompt[:1] + prompt[len(prompt) - room + 1 :]
        examples.append(Example(tuple(prompt), tuple(target)))
    return examples
