"""Stage `export`: write every trained LoRA as a GGUF adapter and check llama.cpp agrees with torch.

peft names (`...layers.3.self_attn.q_proj.lora_A.weight`) map to GGUF weight names
(`blk.3.attn_q.weight`) through gguf's Gemma 3 tensor-name map; `lora_A` (r, in) and `lora_B`
(out, r) are written as they are, with `alpha` = the LoRA alpha (`localpers.engine.adapters.write_lora_gguf`).
The check, per adapter, on a few validation items: the adapter changes llama.cpp's log-probs of the
target, and those log-probs correlate with torch's (the remainder is Q4 quantisation noise).
Each adapter is one task (`export_task`, same resources as an SFT task), writing `<adapter>.gguf`
and `<adapter>.check.json`; an adapter whose check file exists is not redone.
This stage does not train anything.
"""

from __future__ import annotations

import atexit
import re
from pathlib import Path
from typing import Any

import numpy as np

from localpers.engine import torch_model
from localpers.engine.adapters import backbone_architecture, write_lora_gguf
from localpers.errors import LocalpersError
from localpers.publish.executor import Task
from localpers.publish.runner import (
    ContextSpec,
    PublishContext,
    read_json,
    read_torch,
    task_context,
    write_json_atomic,
)
from localpers.publish.sft import adapter_names
from localpers.publish.sft_stage import prepared, task_resources

_PEFT_KEY = re.compile(r"(?:.*\.)?(model\.layers\.\d+\.(?:self_attn|mlp)\.\w+)\.lora_([AB])\.weight$")
CHECK_ITEMS = 4


def gguf_tensors(state: dict[str, Any], n_layer: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """`{blk.i.<name>.weight: (A (r, in), B (out, r))}` from a peft LoRA state dict."""
    import gguf

    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, n_layer)
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key, tensor in state.items():
        match = _PEFT_KEY.match(key)
        if match is None:
            raise LocalpersError(f"unexpected LoRA tensor {key!r}; cannot map it to a GGUF name")
        module, which = match.groups()
        gguf_name = name_map.get_name(module)
        if gguf_name is None:
            raise LocalpersError(f"no GGUF name for {module!r} in the Gemma 3 tensor map")
        pairs.setdefault(gguf_name + ".weight", {})[which] = tensor.detach().float().numpy()
    incomplete = [name for name, ab in pairs.items() if set(ab) != {"A", "B"}]
    if incomplete:
        raise LocalpersError(f"LoRA state lacks A or B for {incomplete[:3]}")
    return {name: (ab["A"], ab["B"]) for name, ab in pairs.items()}


def torch_logprobs(model: Any, examples: list[torch_model.Example]) -> list[np.ndarray]:
    import torch

    model.eval()
    out = []
    with torch.no_grad():
        for example in examples:
            batch = torch_model.make_batch([example])
            logits = torch_model.target_logits(model, batch).float()
            rows = torch.arange(len(example.target), device=logits.device)
            logprobs = torch.log_softmax(logits, dim=-1)[rows, batch["labels"].to(logits.device)]
            out.append(logprobs.cpu().numpy())
    return out


_engines: dict[tuple[str, int], Any] = {}


def _engine(context: PublishContext) -> Any:
    """One llama.cpp engine per process for the checks (adapters are loaded under their own names)."""
    from localpers.engine import Engine

    key = (str(context.backbone_path), context.options.engine_threads)
    if key not in _engines:
        for old in _engines.values():
            old.close()
        _engines.clear()
        engine = Engine(
            context.backbone_path, tap_layers=None, n_ctx=512, n_threads=context.options.engine_threads
        )
        atexit.register(engine.close)  # before interpreter teardown, while llama_cpp is importable
        _engines[key] = engine
    return _engines[key]


def export_task(spec: ContextSpec, name: str) -> dict[str, Any]:
    """Task: write one adapter's GGUF and check it against torch (skipped when its check file exists)."""

    context = task_context(spec)
    options = context.options
    directory = context.stage_dir("export")
    check_file = directory / f"{name}.check.json"
    if check_file.exists():
        return read_json(check_file)
    model, _, train, val, clusters = prepared(context)
    engine = _engine(context)
    state = read_torch(context.stage_dir("sft") / name / "lora.pt", "sft")
    path = write_lora_gguf(
        directory / f"{name}.gguf",
        gguf_tensors(state, engine.n_layer),
        alpha=options.lora_alpha,
        architecture=backbone_architecture(context.backbone_path),
        name=name,
    )
    users = (
        set(range(len(clusters)))
        if name == "global"
        else {u for u, c in enumerate(clusters) if c == int(name.split("-")[1])}
    )
    # held-out items where there are (none with --val-fraction 0, or users of one item each): training items
    sample = [e for e in val if e.user in users][:CHECK_ITEMS] or val[:CHECK_ITEMS] or train[:CHECK_ITEMS]
    result = check_adapter(engine, model, state, path, f"{name}@{path.stat().st_mtime_ns}", sample)
    result["bytes"] = path.stat().st_size
    write_json_atomic(check_file, result)
    context.log(
        f"{name}: {result['bytes'] / 1e6:.1f} MB, llama.cpp vs torch log-prob correlation"
        f" {result['logprob_correlation']}, mean |shift| {result['mean_abs_logprob_shift']}"
    )
    return result


def run(context: PublishContext, directory: Path) -> dict[str, Any]:
    names = adapter_names(context.summary("clusters")["k"])
    spec = context.spec()
    tasks = [Task(export_task, (spec, name), f"export {name}") for name in names]
    with context.progress("export + check adapters", len(names)) as advance:
        checks = context.executor.map(tasks, task_resources(context), on_done=lambda *_: advance(1))
    for engine in _engines.values():  # this process's (the sequential executor's) checks are done
        engine.close()
    _engines.clear()
    return {
        "adapters": dict(zip(names, checks, strict=True)),
        "files": {name: f"{name}.gguf" for name in names},
    }


def check_adapter(
    engine: Any, model: Any, state: dict[str, Any], path: Path, name: str, sample: list[torch_model.Example]
) -> dict[str, Any]:
    """Compare llama.cpp (adapter on and off) with torch on the target tokens of `sample`."""
    engine.load_adapter(path, name)
    with_adapter, without, reference = [], [], []
    torch_model.load_lora_state(model, state)
    reference = torch_logprobs(model, sample)
    for example in sample:
        engine.set_adapter(name)
        with_adapter.append(engine.score(list(example.prompt), [list(example.target)])[0].logprobs)
        engine.set_adapter(None)
        without.append(engine.score(list(example.prompt), [list(example.target)])[0].logprobs)
    on, off, ref = (np.concatenate(x) for x in (with_adapter, without, reference))
    shift = float(np.mean(np.abs(on - off)))
    if shift < 1e-4:
        raise LocalpersError(f"adapter {name} does not change llama.cpp's outputs; the export is broken")
    return {
        "logprob_correlation": round(float(np.corrcoef(on, ref)[0, 1]), 4),
        "mean_abs_logprob_shift": round(shift, 4),
        "target_logprob_llama": round(float(on.mean()), 4),
        "target_logprob_torch": round(float(ref.mean()), 4),
        "target_logprob_backbone": round(float(off.mean()), 4),
        "check_tokens": int(on.size),
    }
