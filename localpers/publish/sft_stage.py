"""Stage `sft` as tasks: one task per adapter (the global one, then every cluster's, side by side).

Task `prepare` measures the precision and the backbone's validation loss once (`precision.json`,
`val_backbone.json`). Then `global` trains; the cluster adapters start from it (`--cluster-init
global`), so they run after it, all at once (with `--cluster-init fresh` all adapters run at once).
Each adapter task trains in its own process or machine (`sft.train_adapter`), on a GPU when it was
given one, and writes `<adapter>/lora.pt`, `val_totals.json` and `record.json`; an adapter whose
record exists is not retrained, so an interrupted or failed stage resumes per adapter (and inside an
adapter from its checkpoint). The torch model and tokenised examples are built once per process.
This module does not train by itself (`sft` does) and does not write GGUF (`export` does).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from localpers.engine import torch_model
from localpers.engine.torch_model import Example
from localpers.publish.executor import GIB, Resources, Task
from localpers.publish.runner import (
    ContextSpec,
    PublishContext,
    read_finished_json,
    read_json,
    read_torch,
    task_context,
    write_json_atomic,
)
from localpers.publish.sft import (
    GLOBAL,
    adapter_names,
    evaluate,
    mean_loss,
    measure_precision,
    planned_steps,
    split_examples,
    train_adapter,
)

# what an adapter's record.json holds once written (the stage summary and the bundle stage read these)
RECORD_FIELDS = ("steps", "train_loss", "tokens_per_second", "val_loss")
_prepared: dict[tuple[str, str], tuple[Any, dict[str, Any], list[Example], list[Example], list[int]]] = {}


def task_resources(context: PublishContext) -> Resources:
    """What one torch task (SFT, export) declares: `threads` CPUs, memory, and a GPU where there are any."""
    options = context.options
    return Resources(
        cpus=options.threads,
        memory=int(options.task_memory_gb * GIB),
        gpus=context.executor.gpus_per_task(options.gpus_per_task),
    )


def prepared(context: PublishContext) -> tuple[Any, dict[str, Any], list[Example], list[Example], list[int]]:
    """(peft model, fresh LoRA state, train examples, validation examples, clusters), once per process."""
    import torch

    options = context.options
    key = (str(context.work), context.keys.get("sft", ""))
    if key not in _prepared:
        _prepared.clear()
        torch.set_num_threads(options.threads)
        device = torch_model.training_device()
        shape = (options.rank, options.lora_alpha, options.dropout, tuple(options.targets))
        # peft's random LoRA A drawn under --seed: the same in every process
        model = torch_model.shared_lora_model(context.backbone_path, *shape, device=device, seed=options.seed)
        fresh = torch_model.fresh_lora_state(context.backbone_path, *shape, device=device, seed=options.seed)
        train, val, clusters = split_examples(context)
        _prepared[key] = (model, fresh, train, val, clusters)
    return _prepared[key]


def prepare_task(spec: ContextSpec) -> dict[str, Any]:
    """Task: the chosen precision, and the backbone's per-user validation loss (both cached in files)."""
    context = task_context(spec)
    directory = context.stage_dir("sft")
    model, fresh, train, val, _ = prepared(context)
    precision_file = directory / "precision.json"
    if precision_file.exists():
        precision_info = read_json(precision_file)
    else:
        torch_model.load_lora_state(model, fresh)
        precision_info = measure_precision(context, model, train)
        write_json_atomic(precision_file, precision_info)
    backbone_file = directory / "val_backbone.json"
    if not backbone_file.exists():
        torch_model.load_lora_state(model, fresh)
        totals = evaluate(model, val, precision_info["chosen"])
        write_json_atomic(backbone_file, {str(u): list(v) for u, v in totals.items()})
    return precision_info


def _val_totals(path: Path) -> dict[int, tuple[float, int]]:
    return {int(u): (float(v[0]), int(v[1])) for u, v in read_json(path).items()}


def adapter_task(spec: ContextSpec, name: str, precision: str) -> dict[str, Any]:
    """Task: train one adapter (unless its record exists), measure its validation loss, write its record."""

    context = task_context(spec)
    options = context.options
    directory = context.stage_dir("sft")
    adapter_dir = directory / name
    record_path = adapter_dir / "record.json"
    record = read_finished_json(context, record_path, RECORD_FIELDS)  # a damaged one is made again
    if record is not None:
        return record
    model, fresh, train, val, clusters = prepared(context)
    if name == GLOBAL:
        users, epochs, init_name, initial = (
            set(range(len(clusters))),
            options.global_epochs,
            "backbone",
            fresh,
        )
    else:
        cluster = int(name.split("-")[1])
        users = {u for u, c in enumerate(clusters) if c == cluster}
        epochs = options.cluster_epochs
        if options.cluster_init == "global":
            initial = read_torch(directory / GLOBAL / "lora.pt", "sft")
            init_name = GLOBAL
        else:
            initial, init_name = fresh, "backbone"
    examples = [e for e in train if e.user in users]
    user_val = [e for e in val if e.user in users]
    steps = planned_steps(len(examples), epochs, options.batch_size, options.max_steps)
    started = time.perf_counter()
    record = train_adapter(context, model, name, examples, steps, initial, precision, adapter_dir)
    totals = evaluate(model, user_val if name != GLOBAL else val, precision)
    write_json_atomic(adapter_dir / "val_totals.json", {str(u): list(v) for u, v in totals.items()})
    backbone = _val_totals(directory / "val_backbone.json")
    init_totals = backbone if init_name == "backbone" else _val_totals(directory / GLOBAL / "val_totals.json")
    record.update(
        {
            "users": len(users),
            "init": init_name,
            "val_items": len(user_val),
            "val_loss_backbone": mean_loss(backbone, users),
            "val_loss_init": mean_loss(init_totals, users),
            "val_loss": mean_loss(totals, users),
            "seconds": round(time.perf_counter() - started, 1),
            "device": str(torch_model.model_device(model)),
        }
    )
    write_json_atomic(record_path, record)
    validation = (
        f"val loss {record['val_loss_init']} -> {record['val_loss']} (backbone {record['val_loss_backbone']})"
        if user_val
        else "no validation items (--val-fraction 0, or users of one item)"
    )
    context.log(f"{name}: {record['steps']} steps, {record['tokens_per_second']} tokens/s, {validation}")
    return record


def run(context: PublishContext, directory: Path) -> dict[str, Any]:
    options = context.options
    k = context.summary("clusters")["k"]
    spec = context.spec()
    resources = task_resources(context)
    context.log(f"sft: {k + 1} adapters on {context.executor.info.kind} ({resources})")
    (precision_info,) = context.executor.map([Task(prepare_task, (spec,), "sft prepare")], resources)
    precision = precision_info["chosen"]
    names = adapter_names(k)
    waves = [names[:1], names[1:]] if options.cluster_init == "global" else [names]
    records: dict[str, Any] = {}
    with context.progress("sft adapters", len(names)) as advance:
        for wave in waves:
            tasks = [Task(adapter_task, (spec, name, precision), f"sft {name}") for name in wave]
            for name, record in zip(
                wave, context.executor.map(tasks, resources, on_done=lambda *_: advance(1)), strict=True
            ):
                records[name] = record
    return {
        "precision": precision_info,
        "adapters": {name: {k: v for k, v in r.items() if k != "train_loss"} for name, r in records.items()},
        "train_loss": {name: r["train_loss"] for name, r in records.items()},
    }
