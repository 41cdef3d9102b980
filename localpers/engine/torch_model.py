"""The backbone in torch for LoRA training: loaded once per process, wrapped once with peft.

The GGUF backbone is dequantised to fp32 (~5 s; ~15 s the first time, which reads the config), so
`shared_lora_model` keeps one peft model per process and the stages swap LoRA weights in and out of it
(`load_lora_state`, `fresh_lora_state`) instead of reloading. transformers reads the config by parsing the
GGUF's header, which walks its whole 262k-token vocabulary (~10 s), so the config is kept in the cache
directory by the backbone's sha256; the tensors are read past transformers' GGUF loader, from the layout
`gguf_layout` reads in milliseconds, where the architecture allows it (`_load_from_layout`).
`target_token_losses` runs the transformer body, gathers the hidden states at the positions that predict
target tokens and applies the tied LM head only there: with a 262,144-token vocabulary, full-sequence
logits would dominate the cost.
Examples are tokenised with llama.cpp's tokenizer (the one the device generates with).
The publisher passes `device=training_device()` (CUDA when torch sees a GPU); batches are built on the
CPU and moved to the model's device in `target_logits`; `lora_state` always returns CPU tensors.
This module does not schedule training, checkpoint, or write GGUF files.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# llama.cpp before torch: torch ships its own libgomp.so.1, and whichever loads first serves both, so torch
# first would leave llama.cpp's threads without the wait policy `threads` sets (tests/test_threads.py)
from localpers.engine import llama  # noqa: F401

# isort: split
from localpers.atomic import atomic_write_text
from localpers.engine.backbone import cached_sha256
from localpers.engine.gguf_layout import gguf_layout, map_tensor
from localpers.errors import LocalpersError
from localpers.paths import cache_dir

PEFT_MODULES = {
    "attn_q": "q_proj",
    "attn_k": "k_proj",
    "attn_v": "v_proj",
    "attn_output": "o_proj",
    "ffn_gate": "gate_proj",
    "ffn_up": "up_proj",
    "ffn_down": "down_proj",
}

PAD_MULTIPLE = 16

# transformers' per-architecture tensor fix-ups that look at nothing but the tensor (Gemma's norm offset,
# or none); the others read config or other tensors, so their backbones go through transformers' loader.
NAME_ONLY_PROCESSORS = frozenset({"TensorProcessor", "Gemma2TensorProcessor"})

# transformers' GGUF loader draws a tqdm bar beside the CLI's own progress; tqdm reads this once, when it is
# first imported (torch imports it), so it is set here, before any function of this module imports torch.
os.environ.setdefault("TQDM_DISABLE", "1")
HUB_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY")

_cache: dict[tuple[Any, ...], Any] = {}
_fresh_states: dict[tuple[Any, ...], dict[str, Any]] = {}


@dataclass(frozen=True)
class Example:
    """One tokenised training example: BOS + prompt, then the target tokens the loss is taken on."""

    prompt: tuple[int, ...]
    target: tuple[int, ...]
    user: int = 0  # the training user's row (publisher); 0 for a single user's examples (CoPe)

    @property
    def n_tokens(self) -> int:
        return len(self.prompt) + len(self.target)


def keep_hub_offline() -> None:
    """No model hub, whatever the environment says: training reads the local GGUF and nothing else.

    Forced rather than defaulted: with a user's HF_HUB_OFFLINE=0, peft looked the backbone's config up on
    huggingface.co while saving a fitted adapter. huggingface_hub reads the variables when it is imported, so an
    already imported copy is switched too.
    """
    for name in HUB_OFFLINE_VARIABLES:
        os.environ[name] = "1"
    hub_constants = sys.modules.get("huggingface_hub.constants")
    if hub_constants is not None:
        hub_constants.HF_HUB_OFFLINE = True
        hub_constants.HF_HUB_DISABLE_TELEMETRY = True


def quiet_transformers() -> None:
    keep_hub_offline()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    with contextlib.suppress(Exception):
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    warnings.filterwarnings("ignore", message="Could not find a config file", category=UserWarning)


def training_device() -> str:
    """'cuda' when torch sees a GPU (a Ray task given one sees exactly it), else 'cpu'."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def cpu_has_bf16() -> bool:
    """Whether this CPU has bf16 instructions (avx512_bf16 or amx_bf16); without them torch emulates bf16, slowly."""
    try:
        with open("/proc/cpuinfo") as handle:
            flags = handle.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def model_device(model: Any) -> Any:
    return next(model.parameters()).device


def load_backbone(path: Path, device: str = "cpu") -> Any:
    """The fp32 transformers model of a GGUF backbone on `device`, cached per process."""
    key = ("backbone", str(path), device)
    if key not in _cache:
        quiet_transformers()
        config = backbone_config(path)
        try:
            model = _load_from_layout(path, config) or _load_with_transformers(path, config)
        except (OSError, ValueError, RuntimeError) as exc:
            raise LocalpersError(f"transformers could not load {path} for training: {exc}") from exc
        model.requires_grad_(False)
        _cache[key] = model.to(device) if device != "cpu" else model
    return _cache[key]


def _load_with_transformers(path: Path, config: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, config=config, dtype=torch.float32, local_files_only=True
    )


def _load_from_layout(path: Path, config: Any) -> Any | None:
    """The model built from the GGUF's tensors directly, or None where only transformers' loader applies.

    transformers' GGUF loader parses the whole header again (~10 s for Gemma's vocabulary) before it
    dequantises the tensors. This runs its tensor loop (gguf's dequantisation, transformers' name map and
    per-architecture fix-ups) over `gguf_layout`'s tensor locations instead, for architectures whose
    fix-ups depend only on the tensor's name; it gives up (None) on a header `gguf_layout` cannot read or
    when any weight would be left unloaded. The result is the same model: tests/test_torch_model.py
    compares weights, buffers and logits with the loader's.
    """
    import numpy as np
    import torch
    from gguf import dequantize
    from transformers import AutoModelForCausalLM

    try:
        from transformers.modeling_gguf_pytorch_utils import (
            TENSOR_PROCESSORS,
            TensorProcessor,
            get_gguf_hf_weights_map,
        )
    except ImportError:
        return None
    try:
        layout = gguf_layout(path)
    except LocalpersError:
        return None  # transformers' own reader decides, and says what is wrong
    processor_class = TENSOR_PROCESSORS.get(layout.architecture, TensorProcessor)
    if processor_class.__name__ not in NAME_ONLY_PROCESSORS:
        return None
    processor = processor_class(config=config.to_dict())
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    try:
        names = get_gguf_hf_weights_map(skeleton, processor)
    except (NotImplementedError, KeyError, AttributeError):
        return None
    state = {}
    for location in layout.tensors:
        weights = dequantize(map_tensor(path, location), location.type)
        result = processor.process(
            weights=weights, name=location.name, tensor_key_mapping=names, parsed_parameters={}
        )
        if result.name in names:
            state[names[result.name]] = torch.from_numpy(np.array(result.weights, copy=True))
    model, info = type(skeleton).from_pretrained(
        None, config=config, state_dict=state, dtype=torch.float32, output_loading_info=True
    )
    if any(info.get(kind) for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")):
        return None
    return model


def backbone_config(path: Path) -> Any:
    """The transformers config of a GGUF backbone: from the cache when this backbone's was read before.

    The cached copy is keyed by the file's sha256 and the transformers version that wrote it; a missing,
    damaged or older one is read from the GGUF again and rewritten (a read-only cache only costs time).
    """
    import transformers
    from transformers import AutoConfig

    cache_file = cache_dir() / "backbones" / f"{cached_sha256(path)[:32]}.transformers-config.json"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
        saved = json.loads(cache_file.read_text())
        if saved["transformers"] == transformers.__version__:
            return AutoConfig.for_model(**saved["config"])
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    with contextlib.suppress(OSError):
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(
            cache_file, json.dumps({"transformers": transformers.__version__, "config": config.to_dict()})
        )
    return config


def shared_lora_model(
    path: Path,
    rank: int,
    alpha: float,
    dropout: float,
    targets: tuple[str, ...],
    device: str = "cpu",
    *,
    seed: int,
) -> Any:
    """One peft LoRA model per (backbone, LoRA shape, device, seed) and process; weights are swapped per adapter.

    peft draws the initial LoRA A matrices from torch's global generator, seeded here with `seed` (after the
    backbone is loaded, which draws random numbers the first time): the same start in every process, and
    another seed's start for another seed (the cache held the first seed's for every later one)."""
    import torch

    key = _lora_key(path, rank, alpha, dropout, targets, device, seed)
    if key not in _cache:
        # peft wraps the model in place, so drop any earlier wrapping of the same backbone first.
        for old in [k for k in _cache if k[0] == "lora" and k[1] == str(path)]:
            _cache.pop(old).unload()
            _fresh_states.pop(old, None)
        backbone = load_backbone(path, device)
        torch.manual_seed(seed)
        model = wrap_lora(backbone, rank, alpha, dropout, targets)
        _cache[key] = model
        _fresh_states[key] = lora_state(model)
    return _cache[key]


def wrap_lora(backbone: Any, rank: int, alpha: float, dropout: float, targets: tuple[str, ...]) -> Any:
    """`backbone` (a transformers causal LM, wrapped in place) with fresh LoRA weights on `targets`."""
    from peft import LoraConfig, get_peft_model

    unknown = [t for t in targets if t not in PEFT_MODULES]
    if unknown:
        raise LocalpersError(f"unknown LoRA target(s) {unknown}; choose from {', '.join(PEFT_MODULES)}")
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=[PEFT_MODULES[t] for t in targets],
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(backbone, config)


def lora_state(model: Any) -> dict[str, Any]:
    """A detached copy of the LoRA weights (peft names without the adapter name)."""
    from peft import get_peft_model_state_dict

    # The embeddings are never trained; "auto" would look the backbone up on the hub to decide.
    weights = get_peft_model_state_dict(model, save_embedding_layers=False)
    return {name: tensor.detach().cpu().clone() for name, tensor in weights.items()}


def load_lora_state(model: Any, state: dict[str, Any]) -> None:
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, state)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise LocalpersError(f"LoRA state does not fit the model: unexpected {unexpected[:3]}")


def fresh_lora_state(
    path: Path,
    rank: int,
    alpha: float,
    dropout: float,
    targets: tuple[str, ...],
    device: str = "cpu",
    *,
    seed: int,
) -> dict:
    """The LoRA weights as peft initialised them under `seed` (B = 0, so the adapter starts as the backbone)."""
    shared_lora_model(path, rank, alpha, dropout, targets, device, seed=seed)
    return _fresh_states[_lora_key(path, rank, alpha, dropout, targets, device, seed)]


def _lora_key(path: Path, *shape_device_and_seed: object) -> tuple[object, ...]:
    """The cache key of a shared LoRA model and its fresh state: backbone, LoRA shape, device and seed."""
    return ("lora", str(path), *shape_device_and_seed)


def make_batch(examples: Sequence[Example], pad_id: int = 0) -> dict[str, Any]:
    """Right-padded input ids, attention mask, and the (row, position) pairs that predict each target."""
    import torch

    longest = max(example.n_tokens for example in examples)
    length = -(-longest // PAD_MULTIPLE) * PAD_MULTIPLE  # few distinct shapes: oneDNN re-JITs per shape
    ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), length), dtype=torch.long)
    rows, positions, labels = [], [], []
    for row, example in enumerate(examples):
        sequence = list(example.prompt) + list(example.target)
        ids[row, : len(sequence)] = torch.tensor(sequence)
        mask[row, : len(sequence)] = 1
        start = len(example.prompt)
        for offset, token in enumerate(example.target):
            rows.append(row)
            positions.append(start + offset - 1)  # the hidden state before the token predicts it
            labels.append(token)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "rows": torch.tensor(rows),
        "positions": torch.tensor(positions),
        "labels": torch.tensor(labels),
        "n_tokens": int(mask.sum()),
    }


def target_logits(model: Any, batch: dict[str, Any]) -> Any:
    """Logits `(n_targets, vocab)` at the target positions only (LM head applied to those rows)."""
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    device = model_device(causal_lm)
    hidden = causal_lm.model(
        input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device)
    ).last_hidden_state
    selected = hidden[batch["rows"].to(device), batch["positions"].to(device)]
    logits = causal_lm.lm_head(selected)
    cap = getattr(causal_lm.config, "final_logit_softcapping", None)
    if cap:
        import torch

        logits = torch.tanh(logits / cap) * cap
    return logits


def target_token_losses(model: Any, batch: dict[str, Any]) -> Any:
    """Per-target-token cross-entropy, float32 `(n_targets,)`."""
    import torch.nn.functional as functional

    logits = target_logits(model, batch)
    return functional.cross_entropy(logits.float(), batch["labels"].to(logits.device), reduction="none")


def tokenise_examples(backbone: Path, pairs: list[tuple[str, str, int]], max_len: int) -> list[Example]:
    """`(prompt, output, user)` -> Examples: BOS + the prompt, then `" " + output + "\\n"`.

    This matches the device: it prefills the tokenised prompt and generates the headline after it.
    Over-long prompts lose their beginning (after BOS); the target is kept whole.
    """
    engine = _tokeniser_engine(backbone)
    examples = []
    for prompt_text, output, user in pairs:
        prompt = engine.tokenize(prompt_text, add_bos=True)
        target = engine.tokenize(" " + output.strip() + "\n", add_bos=False)
        target = target[: max_len // 2]
        room = max_len - len(target)
        if len(prompt) > room:
            prompt = prompt[:1] + prompt[len(prompt) - room + 1 :]
        examples.append(Example(prompt=tuple(prompt), target=tuple(target), user=user))
    return examples


def _tokeniser_engine(backbone: Path) -> Any:
    key = ("tokeniser", str(backbone))
    if key not in _cache:
        from localpers.engine import Engine

        engine = Engine(backbone, n_ctx=64, tap_layers=None, n_threads=1)
        atexit.register(engine.close)  # before interpreter teardown, when llama_cpp is still importable
        _cache[key] = engine
    return _cache[key]
