"""Experiment: the conditioned global adapter trained on preferences (DPO), the author's headline over its own.

Issue 20's adapters learn the authors' headlines by likelihood, and gain likelihood (gold +0.1 nats/token) far
more than ROUGE: greedy decoding still writes what the adapter wrote before. Direct preference optimisation
(Rafailov et al. 2023) trains the mode instead: for the same history prompt, the author's real headline (y+)
should gain log-probability over the adapter's own greedy headline (y-), relative to the starting adapter
(the reference). The loss per pair is

    -log sigmoid(beta * ((log pi(y+) - log ref(y+)) - (log pi(y-) - log ref(y-))))
    + nll_weight * (mean negative log-likelihood per token of y+ under pi)

(the second term keeps the authors' headlines likely, as in RPO, Pang et al. 2024).

Input: `scripts/self_targets.py generate`'s candidates file (its rows carry the device's prompt, the author's
headline and the candidates, greedy first), made from training authors' items only. Starts from a trained
adapter's `lora.pt` (peft state), writes `lora.pt` and a GGUF adapter into `--out`, for
`scripts/swap_adapter.py`. `--rejected worst` takes as y- the candidate farthest from the author's headline (unigram
F1) instead of the greedy one. Nothing here changes the product.

    python scripts/train_preference.py ../dpo/cands.jsonl --init ../heldout-a/.work/sft/global/lora.pt \
        --out ../dpo/beta01 --beta 0.1 --epochs 1
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localpers.methods.consensus import unigram_f1, unigrams

TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


@dataclass(frozen=True)
class Pair:
    prompt: str
    chosen: str
    rejected: str


def read_pairs(path: Path, rejected_rule: str, max_overlap: float) -> list[Pair]:
    """Preference pairs from a candidates file: (author's headline, greedy or worst candidate).

    Pairs whose rejected headline already overlaps the author's by `max_overlap` or more (unigram F1) are left
    out: there is little to prefer.
    """
    pairs = []
    for number, line in enumerate(path.open(), start=1):
        row = json.loads(line)
        missing = [field for field in ("prompt", "reference", "candidates") if field not in row]
        if missing:
            raise SystemExit(
                f"{path}, line {number}: no {', '.join(missing)}; write the file with this version of "
                "`scripts/self_targets.py generate`, which records the device's prompt"
            )
        gold = row["reference"].strip()
        texts = [t.strip() for t in row["candidates"] if t.strip()]
        if not texts or not gold:
            continue
        gold_counts = unigrams(gold)
        if rejected_rule == "greedy":
            rejected = texts[0]
        else:
            rejected = min(texts, key=lambda t: unigram_f1(unigrams(t), gold_counts))
        if unigram_f1(unigrams(rejected), gold_counts) >= max_overlap:
            continue
        pairs.append(Pair(prompt=row["prompt"], chosen=gold, rejected=rejected))
    return pairs


def preference_loss(
    policy_chosen: Any,
    policy_rejected: Any,
    reference_chosen: Any,
    reference_rejected: Any,
    beta: float,
) -> tuple[Any, Any]:
    """DPO's loss per pair and the implicit reward margin (both tensors of shape (n_pairs,))."""
    import torch.nn.functional as functional

    margin = (policy_chosen - reference_chosen) - (policy_rejected - reference_rejected)
    return -functional.logsigmoid(beta * margin), margin


def sequence_logprobs(model: Any, batch: dict[str, Any], n_rows: int) -> tuple[Any, Any]:
    """Summed target log-probability per row, and the number of target tokens per row."""
    import torch

    from localpers.engine import torch_model

    token_logprobs = -torch_model.target_token_losses(model, batch)
    rows = batch["rows"].to(token_logprobs.device)
    sums = torch.zeros(n_rows, device=token_logprobs.device).index_add(0, rows, token_logprobs)
    counts = torch.zeros(n_rows, device=token_logprobs.device).index_add(
        0, rows, torch.ones_like(token_logprobs)
    )
    return sums, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("candidates", type=Path)
    parser.add_argument(
        "--init", type=Path, required=True, help="the starting adapter's lora.pt (peft state)"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--nll-weight", type=float, default=1.0)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--batch-pairs", type=int, default=8)
    parser.add_argument("--rejected", choices=("greedy", "worst"), default="greedy")
    parser.add_argument("--max-overlap", type=float, default=0.8)
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--alpha", type=float, default=32.0)
    args = parser.parse_args()

    import torch

    from localpers.engine import torch_model
    from localpers.engine.adapters import backbone_architecture, write_lora_gguf
    from localpers.engine.backbone import default_backbone_path
    from localpers.publish.export import gguf_tensors
    from localpers.publish.sft import autocast

    torch.manual_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    pairs = read_pairs(args.candidates, args.rejected, args.max_overlap)
    print(f"{len(pairs)} preference pairs", file=sys.stderr)
    backbone = default_backbone_path()
    texts = [(p.prompt, p.chosen, 0) for p in pairs] + [(p.prompt, p.rejected, 0) for p in pairs]
    examples = torch_model.tokenise_examples(backbone, texts, 256)
    chosen_examples, rejected_examples = examples[: len(pairs)], examples[len(pairs) :]
    # dropout 0: the policy at step 0 must equal the reference
    model = torch_model.shared_lora_model(backbone, args.rank, args.alpha, 0.0, TARGETS, seed=args.seed)
    torch_model.load_lora_state(model, torch.load(args.init, weights_only=False))

    def logprobs(indices: list[int]) -> tuple[Any, Any, Any]:
        chunk = [chosen_examples[i] for i in indices] + [rejected_examples[i] for i in indices]
        batch = torch_model.make_batch(chunk)
        with autocast(args.precision):
            sums, counts = sequence_logprobs(model, batch, len(chunk))
        n = len(indices)
        return sums[:n].float(), sums[n:].float(), counts[:n]

    started = time.perf_counter()
    model.eval()
    reference = torch.zeros(len(pairs), 2)
    with torch.no_grad():
        for start in range(0, len(pairs), args.batch_pairs):
            indices = list(range(start, min(start + args.batch_pairs, len(pairs))))
            chosen, rejected, _ = logprobs(indices)
            reference[indices, 0], reference[indices, 1] = chosen.cpu(), rejected.cpu()
    print(f"reference log-probs in {time.perf_counter() - started:.0f} s", file=sys.stderr)

    steps = max(1, math.ceil(args.epochs * len(pairs) / args.batch_pairs))
    rng = np.random.default_rng(args.seed)
    order: list[int] = []
    while len(order) < steps * args.batch_pairs:
        order.extend(int(i) for i in rng.permutation(len(pairs)))
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=args.lr, weight_decay=0.0)
    warmup = max(1, steps // 10)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: (
            (s + 1) / warmup
            if s < warmup
            else 0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, steps - warmup)))
        ),
    )
    model.train()
    log = []
    for step in range(steps):
        indices = order[step * args.batch_pairs : (step + 1) * args.batch_pairs]
        chosen, rejected, chosen_tokens = logprobs(indices)
        losses, margin = preference_loss(
            chosen,
            rejected,
            reference[indices, 0].to(chosen.device),
            reference[indices, 1].to(chosen.device),
            args.beta,
        )
        nll = (-chosen / chosen_tokens).mean()
        loss = losses.mean() + args.nll_weight * nll
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        record = {
            "step": step + 1,
            "dpo": round(float(losses.mean().detach()), 4),
            "nll": round(float(nll.detach()), 4),
            "margin": round(float(margin.mean().detach()), 3),
            "accuracy": round(float((margin > 0).float().mean()), 3),
        }
        log.append(record)
        print(json.dumps(record), file=sys.stderr, flush=True)
    state = torch_model.lora_state(model)
    torch.save(state, args.out / "lora.pt")
    n_layer = model.get_base_model().config.num_hidden_layers
    write_lora_gguf(
        args.out / "global.gguf",
        gguf_tensors(state, n_layer),
        alpha=args.alpha,
        architecture=backbone_architecture(backbone),
        name="localpers-preference",
    )
    summary = {
        "pairs": len(pairs),
        "steps": steps,
        "seconds": round(time.perf_counter() - started),
        **vars(args),
    }
    summary = {key: str(value) if isinstance(value, Path) else value for key, value in summary.items()}
    (args.out / "train.json").write_text(json.dumps({"summary": summary, "log": log}, indent=1) + "\n")
    print(f"wrote {args.out / 'global.gguf'}", file=sys.stderr)


if __name__ == "__main__":
    main()
