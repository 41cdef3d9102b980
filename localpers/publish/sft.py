"""Stage `sft`: one LoRA on all training users (`global`) and one per cluster (`cluster-<c>`).

Loss: cross-entropy on the output tokens only, with the LM head applied at target positions only
(`torch_model.target_token_losses`). Optimiser: AdamW, linear warm-up then cosine decay. Precision:
with `--precision auto` a few steps are timed in fp32 and under bf16 autocast and the faster is kept
(fp32 without timing on a CPU without bf16 instructions); an explicit `bf16` on such a CPU is kept with a
warning in the log, since torch then emulates it several times slower.
Cluster adapters start from the trained global adapter (`--cluster-init global`) or from scratch.
Each adapter checkpoints every `checkpoint_every` steps to `<adapter>/checkpoint.pt` (LoRA weights,
optimiser, scheduler, step, losses, random states) so an interrupted run resumes where it stopped and
draws the dropout masks an uninterrupted run would; its final weights go to `<adapter>/lora.pt`.
Validation loss (mean per target token over the users' held-out items) is measured for the backbone, the
starting point and the trained adapter.
Every adapter's dropout is seeded from (seed, adapter name), so it trains the same in whichever process
runs it. This module holds the training mechanics; `sft_stage` schedules the adapters as tasks.
This stage does not write GGUF (stage `export` does).
"""

from __future__ import annotations

import math
import os
import pickle
import time
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from localpers.engine import torch_model
from localpers.engine.torch_model import Example, cpu_has_bf16
from localpers.publish.clusters import load_assignment
from localpers.publish.prompts import user_prompts
from localpers.publish.runner import PublishContext

GLOBAL = "global"
EVAL_BATCH = 16


def adapter_names(k: int) -> list[str]:
    return [GLOBAL] + [f"cluster-{c}" for c in range(k)]


def split_examples(context: PublishContext) -> tuple[list[Example], list[Example], list[int]]:
    """All training and validation examples (user = index in the corpus) and each user's cluster."""
    assignment = load_assignment(context)
    rows: list[tuple[str, str, int]] = []
    is_val: list[bool] = []
    clusters: list[int] = []
    for index, (user, entry) in enumerate(zip(context.corpus.users, assignment["users"], strict=True)):
        held_out = set(entry["val"])
        clusters.append(int(entry["cluster"]))
        for item_index, (item, prompt) in enumerate(
            zip(user.history, user_prompts(context, user, context.options.example_pool), strict=True)
        ):
            rows.append((prompt, item.output, index))
            is_val.append(item_index in held_out)
    examples = torch_model.tokenise_examples(context.backbone_path, rows, context.options.max_seq_len)
    train = [e for e, v in zip(examples, is_val, strict=True) if not v]
    val = [e for e, v in zip(examples, is_val, strict=True) if v]
    return train, val, clusters


def autocast(precision: str, device: str = "cpu") -> Any:
    import torch

    if precision == "bf16":
        return torch.autocast(device, dtype=torch.bfloat16)
    return torch.autocast(device, enabled=False)


def measure_precision(context: PublishContext, model: Any, examples: list[Example]) -> dict[str, Any]:
    """The training precision: an explicit one as asked (bf16 on a CPU without bf16 instructions with a warning),
    fp32 on such a CPU under `auto`, else the faster of fp32 and bf16 over a few timed forward+backward passes
    (gradients discarded)."""
    options = context.options
    device = torch_model.model_device(model).type
    if options.precision == "bf16" and device == "cpu" and not cpu_has_bf16():
        # Asked for explicitly, so kept; without these instructions torch emulates bf16, several times slower.
        context.log(
            "warning: --precision bf16 on a CPU without avx512_bf16/amx_bf16 trains several times slower "
            "than fp32 here; --precision auto measures and picks"
        )
        return {"chosen": "bf16", "measured": {}, "warning": "no avx512_bf16/amx_bf16"}
    if options.precision != "auto":
        return {"chosen": options.precision, "measured": {}}
    if device == "cpu" and not cpu_has_bf16():
        return {"chosen": "fp32", "measured": {}, "reason": "no avx512_bf16/amx_bf16"}
    batches = [
        torch_model.make_batch(examples[i : i + options.batch_size])
        for i in range(0, 3 * options.batch_size, options.batch_size)
    ]
    batches = [b for b in batches if b["n_tokens"]]
    measured: dict[str, float] = {}
    model.train()
    for precision in ("fp32", "bf16"):  # warm-up: bf16 kernels are JIT-compiled on first use
        for batch in batches:
            _train_pass(model, batch, precision)
    for precision in ("fp32", "bf16", "fp32", "bf16"):
        started, tokens = time.perf_counter(), 0
        for batch in batches:
            _train_pass(model, batch, precision)
            tokens += batch["n_tokens"]
        rate = round(tokens / (time.perf_counter() - started), 1)
        measured[precision] = max(measured.get(precision, 0.0), rate)
    model.zero_grad(set_to_none=True)
    chosen = max(measured, key=measured.get)
    context.log(f"sft precision: {measured} tokens/s -> {chosen}")
    return {"chosen": chosen, "measured": measured}


def _train_pass(model: Any, batch: dict[str, Any], precision: str) -> float:
    with autocast(precision, torch_model.model_device(model).type):
        loss = torch_model.target_token_losses(model, batch).mean()
    loss.backward()
    return float(loss.detach())


def evaluate(model: Any, examples: list[Example], precision: str) -> dict[int, tuple[float, int]]:
    """Per user: (summed target-token loss, number of target tokens) of the current weights."""
    import torch

    model.eval()
    totals: dict[int, tuple[float, int]] = {}
    with torch.no_grad():
        for start in range(0, len(examples), EVAL_BATCH):
            chunk = examples[start : start + EVAL_BATCH]
            batch = torch_model.make_batch(chunk)
            with autocast(precision, torch_model.model_device(model).type):
                losses = torch_model.target_token_losses(model, batch).float().cpu().numpy()
            rows = batch["rows"].numpy()
            for row, example in enumerate(chunk):
                loss_sum, count = totals.get(example.user, (0.0, 0))
                picked = losses[rows == row]
                totals[example.user] = (loss_sum + float(picked.sum()), count + len(picked))
    return totals


def mean_loss(totals: dict[int, tuple[float, int]], users: set[int]) -> float:
    loss = sum(totals[u][0] for u in users if u in totals)
    count = sum(totals[u][1] for u in users if u in totals)
    return round(loss / count, 4) if count else float("nan")


def planned_steps(n_examples: int, epochs: float, batch_size: int, max_steps: int | None) -> int:
    steps = max(1, math.ceil(epochs * n_examples / batch_size))
    return min(steps, max_steps) if max_steps else steps


def train_adapter(
    context: PublishContext,
    model: Any,
    name: str,
    examples: list[Example],
    steps: int,
    initial_state: dict[str, Any],
    precision: str,
    directory: Path,
) -> dict[str, Any]:
    """Train one adapter from `initial_state`, resuming from its checkpoint; returns its training record."""
    import torch

    options = context.options
    directory.mkdir(parents=True, exist_ok=True)
    checkpoint_path = directory / "checkpoint.pt"
    torch_model.load_lora_state(model, initial_state)
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=options.lr, weight_decay=0.0)
    warmup = max(1, min(100, steps // 10))

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    step, losses, tokens_seen, seconds = 0, [], 0, 0.0
    torch.manual_seed(adapter_seed(options.seed, name))  # dropout: the same masks in any process
    saved = None
    if checkpoint_path.exists():
        try:
            saved = torch.load(
                checkpoint_path, weights_only=False, map_location=torch_model.model_device(model)
            )
        except (EOFError, pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError) as exc:
            if isinstance(exc, RuntimeError) and "PytorchStreamReader" not in str(exc):
                raise  # not the file's bytes (say a GPU out of memory): the checkpoint is kept
            # cut short by a crash or a full disk: set aside, and only this adapter's steps are trained again
            aside = checkpoint_path.with_name(checkpoint_path.name + ".damaged")
            context.log(
                f"{name}: checkpoint {checkpoint_path} is damaged ({type(exc).__name__}), moved to {aside};"
                " training it anew"
            )
            checkpoint_path.replace(aside)
    if saved is not None:
        torch_model.load_lora_state(model, saved["lora"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        step, losses, tokens_seen, seconds = saved["step"], saved["losses"], saved["tokens"], saved["seconds"]
        context.log(f"{name}: resuming at step {step}/{steps}")
        if not _restore_rng(saved, torch_model.model_device(model)):
            # Kept rather than refused: the steps done are valid training, and the only difference from an
            # uninterrupted run is which dropout masks the remaining steps draw (as another seed would).
            context.log(
                f"{name}: checkpoint {checkpoint_path} predates saved random states; the remaining steps draw"
                " other dropout masks than an uninterrupted run would"
            )
    order = _batch_order(len(examples), steps, options.batch_size, options.seed, name)
    model.train()
    with context.progress(f"sft {name}", steps) as advance:
        advance(step)
        while step < steps:
            started = time.perf_counter()
            batch = torch_model.make_batch([examples[i] for i in order[step]])
            loss = _train_pass(model, batch, precision)
            torch.nn.utils.clip_grad_norm_(parameters, 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            losses.append(round(loss, 4))
            tokens_seen += batch["n_tokens"]
            seconds += time.perf_counter() - started
            advance(1)
            if step % options.checkpoint_every == 0 or step == steps:
                _save_checkpoint(
                    checkpoint_path, model, optimizer, scheduler, step, losses, tokens_seen, seconds
                )
    final = torch_model.lora_state(model)
    _atomic_torch_save(final, directory / "lora.pt")
    return {
        "steps": steps,
        "examples": len(examples),
        "train_loss": losses,
        "tokens": tokens_seen,
        "train_seconds": round(seconds, 1),
        "tokens_per_second": round(tokens_seen / max(seconds, 1e-9), 1),
    }


def adapter_seed(seed: int, name: str) -> int:
    """The torch seed of one adapter's training: independent of which adapters ran before it."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % 2**31


def _batch_order(n: int, steps: int, batch_size: int, seed: int, name: str) -> list[list[int]]:
    """Deterministic batches (reshuffled every epoch), so a resumed run sees the same data order."""
    rng = np.random.default_rng([seed, sum(name.encode())])
    order: list[int] = []
    while len(order) < steps * batch_size:
        order.extend(int(i) for i in rng.permutation(n))
    return [order[i * batch_size : (i + 1) * batch_size] for i in range(steps)]


def _atomic_torch_save(payload: Any, path: Path) -> None:
    import torch

    partial = path.with_name(path.name + ".partial")
    torch.save(payload, partial)
    with partial.open(
        "rb+"
    ) as written:  # on disk before the rename: a power cut leaves the old file or this one
        os.fsync(written.fileno())
    os.replace(partial, path)


def _save_checkpoint(
    path: Path,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    step: int,
    losses: list[float],
    tokens: int,
    seconds: float,
) -> None:
    _atomic_torch_save(
        {
            "lora": torch_model.lora_state(model),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "step": step,
            "losses": losses,
            "tokens": tokens,
            "seconds": seconds,
            "rng": _rng_state(torch_model.model_device(model)),
        },
        path,
    )


def _rng_state(device: Any) -> dict[str, Any]:
    """The random states the next steps' dropout draws from: the CPU's, and the GPU's when training on one."""
    import torch

    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _restore_rng(saved: dict[str, Any], device: Any) -> bool:
    """Put back the random states a checkpoint saved, so a resumed run draws the masks an uninterrupted one
    would; False for a checkpoint written before they were saved."""
    import torch

    state = saved.get("rng")
    if state is None:
        return False
    # torch.load's map_location may have moved these byte tensors to the GPU; the setters take CPU tensors.
    torch.set_rng_state(state["cpu"].cpu())
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)
    return True
