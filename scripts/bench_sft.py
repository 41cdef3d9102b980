"""SFT throughput benchmark: the publisher's own LoRA training loop on a CPU or a GPU, in tokens per second.

Times `localpers.publish.sft.train_adapter` (forward, backward, gradient clipping, AdamW, scheduler; the LM
head applied at target positions only) on examples shaped like the publisher's: the same number of prompt and
target tokens as real history-conditioned training examples, with the LoRA shape of the default options.

Two steps, because the machine that times may hold neither the backbone nor llama.cpp's tokeniser:

    # where the backbone and the corpus are: real examples' token counts and the backbone's transformers config
    python scripts/bench_sft.py shapes --data ../shared/data/news-headlines/train.jsonl --out shapes.json
    # anywhere with torch and peft: time the loop on the backbone (--weights backbone) or on a model of the same
    # shape with random weights (--weights random; the arithmetic, and so the speed, is the same)
    python scripts/bench_sft.py time --shapes shapes.json --weights random --device cuda \\
        --precision fp32 bf16 --batch-sizes 8 64 --steps 40 --json

The token ids are random (the speed of a step does not depend on them); the loss values mean nothing. What it
measures is throughput only: it does not train an adapter anyone uses, and nothing is written outside a
temporary directory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localpers.engine import torch_model
from localpers.engine.torch_model import Example
from localpers.publish.options import PublishOptions


def write_shapes(data: Path, out: Path, examples: int, model: str | None, seed: int) -> None:
    """Token counts of `examples` real conditioned training examples of `data`, and the backbone's config."""
    from localpers.engine.backbone import resolve_backbone
    from localpers.publish.corpus import load_corpus
    from localpers.publish.prompts import user_prompts

    backbone = resolve_backbone(model).path
    # the demo bundle's prompt format (its manifest's `prompt`: 5 examples, none described)
    options = PublishOptions(corpus=data, out=out.parent, history_examples=5)
    context = _ScriptContext(options)
    rows: list[tuple[str, str, int]] = []
    for user in load_corpus(data).users:
        prompts = user_prompts(context, user)  # type: ignore[arg-type]  # the publisher's own training prompts
        rows += [(prompt, item.output, 0) for prompt, item in zip(prompts, user.history, strict=True)]
    random.Random(seed).shuffle(rows)
    tokenised = torch_model.tokenise_examples(backbone, rows[:examples], options.max_seq_len)
    config = torch_model.load_backbone(backbone).config.to_dict()
    shapes = {
        "data": str(data),
        "backbone": backbone.name,
        "lengths": [[len(e.prompt), len(e.target)] for e in tokenised],
        "config": config,
    }
    out.write_text(json.dumps(shapes) + "\n")
    mean = sum(p + t for p, t in shapes["lengths"]) / len(shapes["lengths"])
    print(f"{out}: {len(tokenised)} examples, {mean:.1f} tokens each on average")


def random_model(config: dict[str, Any], device: str) -> Any:
    """A causal LM of the recorded config with random weights, fp32, frozen, on `device`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch_model.quiet_transformers()
    settings = dict(config)
    model_type = settings.pop("model_type")
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(model_type, **settings), dtype=torch.float32
    )
    model.requires_grad_(False)
    return model.to(device)


@dataclass
class _ScriptContext:
    """What `user_prompts` and `train_adapter` read of a publisher context: options, a log line, a progress bar."""

    options: PublishOptions

    def log(self, message: str) -> None:
        print(message, file=sys.stderr)

    @contextlib.contextmanager
    def progress(self, description: str, total: int) -> Iterator[Callable[[int], None]]:
        yield lambda n=1: None


def synthetic_examples(lengths: list[list[int]], vocab: int, count: int, seed: int) -> list[Example]:
    """`count` examples with the recorded (prompt, target) token counts, cycled, and random token ids."""
    rng = random.Random(seed)
    examples = []
    for index in range(count):
        prompt_len, target_len = lengths[index % len(lengths)]
        prompt = (2, *(rng.randrange(3, vocab) for _ in range(prompt_len - 1)))
        examples.append(
            Example(prompt=prompt, target=tuple(rng.randrange(3, vocab) for _ in range(target_len)))
        )
    return examples


def time_training(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch

    from localpers.publish.sft import train_adapter

    shapes = json.loads(args.shapes.read_text())
    device = args.device if args.device != "auto" else torch_model.training_device()
    if device == "cpu":
        torch.set_num_threads(args.threads)
    defaults = PublishOptions(corpus=args.shapes, out=args.shapes.parent)
    if args.weights == "random":
        backbone = random_model(shapes["config"], device)
    else:
        from localpers.engine.backbone import resolve_backbone

        backbone = torch_model.load_backbone(resolve_backbone(args.model).path, device)
    model = torch_model.wrap_lora(
        backbone, defaults.rank, defaults.lora_alpha, defaults.dropout, defaults.targets
    )
    fresh = torch_model.lora_state(model)
    vocab = int(shapes["config"]["vocab_size"])
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for batch_size in args.batch_sizes:
            examples = synthetic_examples(
                shapes["lengths"], vocab, (args.warmup + args.steps) * batch_size, 0
            )
            options = PublishOptions(
                corpus=args.shapes, out=Path(scratch), batch_size=batch_size, checkpoint_every=10**9
            )
            context = _ScriptContext(options)
            for precision in args.precision:
                for name, steps in (("warmup", args.warmup), ("timed", args.steps)):
                    directory = Path(scratch) / f"{precision}-{batch_size}-{name}"
                    started = time.perf_counter()
                    record = train_adapter(context, model, name, examples, steps, fresh, precision, directory)
                    wall = time.perf_counter() - started
                if device == "cuda":
                    torch.cuda.synchronize()
                results.append(
                    {
                        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                        "threads": torch.get_num_threads() if device == "cpu" else None,
                        "weights": args.weights,
                        "precision": precision,
                        "batch_size": batch_size,
                        "steps": steps,
                        "tokens": record["tokens"],
                        "tokens_per_second": record["tokens_per_second"],
                        "seconds_per_step": round(record["train_seconds"] / steps, 4),
                        "wall_seconds": round(wall, 2),
                        "final_loss": record["train_loss"][-1],
                    }
                )
                row = results[-1]
                print(
                    f"{row['device']}  {precision:>4}  batch {batch_size:>3}: {row['tokens_per_second']:>9.1f} tokens/s, "
                    f"{row['seconds_per_step']:.4f} s/step over {steps} steps",
                    file=sys.stderr if args.json else sys.stdout,
                    flush=True,
                )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    shapes = commands.add_parser(
        "shapes", help="record real examples' token counts and the backbone's config"
    )
    shapes.add_argument("--data", type=Path, required=True)
    shapes.add_argument("--out", type=Path, required=True)
    shapes.add_argument("--examples", type=int, default=512)
    shapes.add_argument("--model", default=None, help="backbone GGUF (default: the configured one)")
    shapes.add_argument("--seed", type=int, default=0)
    timing = commands.add_parser("time", help="time the training loop")
    timing.add_argument("--shapes", type=Path, required=True)
    timing.add_argument("--weights", choices=("random", "backbone"), default="random")
    timing.add_argument("--model", default=None, help="backbone GGUF for --weights backbone")
    timing.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    timing.add_argument("--precision", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    timing.add_argument("--batch-sizes", nargs="+", type=int, default=[8])
    timing.add_argument("--steps", type=int, default=20)
    timing.add_argument("--warmup", type=int, default=3)
    timing.add_argument("--threads", type=int, default=2, help="torch threads on a CPU")
    timing.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "shapes":
        write_shapes(args.data, args.out, args.examples, args.model, args.seed)
        return 0
    results = time_training(args)
    if args.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
