"""Stage `export`: write every trained LoRA as a GGUF adapter and check llama.cpp agrees with torch.

peft names (`...layers.3.self_attn.q_proj.lora_A.weight`) map to GGUF weight names
(`blk.3.attn_q.weight`) through gguf's Gemma 3 tensor-name map; `lora_A` (r, in) and `lora_B`
(out, r) are written as they are, with `alpha` = the LoRA alpha (`localpers.engine.adapters.write_lora_gguf`).
The check, per adapter, on a few validation items: the adapter changes llama.cpp's log-probs of the
target, and those log-probs correlate with torch's (the remainder is Q4 quantisation noise).
This stage does not train anything.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from localpers.engine import torch_model
from localpers.engine.adapters import backbone_architecture, write_lora_gguf
from localpers.errors import LocalpersError
from localpers.publish.runner import PublishContext
from localpers.publish.sft import adapter_names, split_examples

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
            logprobs = torch.log_softmax(logits, dim=-1)[torch.arange(len(example.target)), batch["labels"]]
            out.append(logprobs.numpy())
    return out


def run(context: PublishContext, directory: Path) -> dict[str, Any]:
    import torch

    from localpers.engine import Engine

    options = context.options
    sft_dir = context.stage_dir("sft")
    k = context.summary("clusters")["k"]
    architecture = backbone_architecture(context.backbone_path)
    engine = Engine(context.backbone_path, tap_layers=None, n_ctx=512, n_threads=options.engine_threads)
    _, val, clusters = split_examples(context)
    model = torch_model.shared_lora_model(
        context.backbone_path, options.rank, options.lora_alpha, options.dropout, tuple(options.targets)
    )
    results: dict[str, Any] = {}
    try:
        with context.progress("export + check adapters", k + 1) as advance:
            for name in adapter_names(k):
                state = torch.load(sft_dir / name / "lora.pt", weights_only=False)
                tensors = gguf_tensors(state, engine.n_layer)
                path = write_lora_gguf(
                    directory / f"{name}.gguf",
                    tensors,
                    alpha=options.lora_alpha,
                    architecture=architecture,
                    name=name,
                )
                users = (
                    set(range(len(clusters)))
                    if name == "global"
                    else {u for u, c in enumerate(clusters) if c == int(name.split("-")[1])}
                )
                sample = [e for e in val if e.user in users][:CHECK_ITEMS] or val[:CHECK_ITEMS]
                results[name] = check_adapter(engine, model, state, path, name, sample)
                results[name]["bytes"] = path.stat().st_size
                context.log(
                    f"{name}: {path.stat().st_size / 1e6:.1f} MB, llama.cpp vs torch log-prob correlation"
                    f" {results[name]['logprob_correlation']}, mean |shift| {results[name]['mean_abs_logprob_shift']}"
                )
                advance(1)
    finally:
        engine.close()
    return {"adapters": results, "files": {name: f"{name}.gguf" for name in adapter_names(k)}}


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
