"""How far a backbone re-quantized with another vocabulary matrix type moves the global adapter's outputs.

Writes a copy of the shipped backbone re-quantized by llama.cpp's own `llama_model_quantize` (same file type,
`allow_requantize`, only `token_embd` - the tied input and output matrix - of another type), then runs the bundle's
global adapter on both backbones over the last --items history items of the first --authors authors of --data:
the greedy headline and the first token's distribution after the prompt, and the authors' own headlines
teacher-forced. Prints how many headlines are identical, how often the first token's argmax agrees, the mean KL
divergence of that distribution (shipped || other), the seconds each backbone took, and the authors' headlines' mean
log-probability per token on each (`--backbone-alone`: also without the adapter, which was trained on the shipped
file: what the re-quantization costs the backbone itself). `--embedding q8_0` is the control: re-quantized the same
way, nothing should move.
Time the step cost with `scripts/bench_batch_rows.py --model <written file>` (docs/PERFORMANCE.md, fifty-fifth
session). This script changes no file of the project and no setting; it measures a publisher's option.

`--body q4_0` re-quantizes the other matrices too (the shipped file's Q5_0 ones, which llama.cpp's CPU backend has
no repacked x86 kernel for, become Q4_0, which it has; PERFORMANCE.md, sixty-fourth session); `--body q8_0` makes
them Q8_0, which keeps their 5-bit values nearly exactly (sixty-fifth session).

Usage: python scripts/requantized_backbone.py --data ../shared/data/news-headlines/train.jsonl
       [--embedding iq4_nl|q4_0|q8_0] [--body q4_k_m|q4_0|q8_0] [--out /tmp/backbone.gguf]
       [--authors 40] [--items 2] [--bundle DIR] [--backbone-alone]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time
from pathlib import Path

import numpy as np

from localpers.bundle.format import default_bundle_dir
from localpers.engine import Engine
from localpers.engine.backbone import resolve_backbone
from localpers.engine.generation import generate
from localpers.engine.llama import llama_cpp  # under the product's OpenMP wait policy
from localpers.tasks import get_task

TYPES = {
    "iq4_nl": llama_cpp.GGML_TYPE_IQ4_NL,
    "q4_0": llama_cpp.GGML_TYPE_Q4_0,
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
}
# llama.cpp's file types for the other matrices: the shipped file's (Q4_K_M, whose 640-column matrices fall back to
# Q5_0) or Q4_0 throughout.
BODY_TYPES = {
    "q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
    "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
    "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
}


def requantize(source: Path, target: Path, embedding: str, body: str = "q4_k_m") -> None:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = BODY_TYPES[body]
    params.allow_requantize = True
    params.token_embedding_type = params.output_tensor_type = TYPES[embedding]
    if llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"llama.cpp could not write {target}")


def run(
    model: Path, adapter: Path | None, prompts: list[str], outputs: list[str], *, greedy: bool = True
) -> tuple[list[tuple[str, np.ndarray]], float, float]:
    """Each prompt's greedy headline and first-token log-probabilities under `adapter` (None: the backbone
    alone; `greedy` False: none decoded); the seconds they took; the authors' own headlines' mean
    log-probability per token, teacher-forced."""
    task = get_task("headline")
    engine = Engine(model)
    try:
        if adapter is not None:
            engine.set_adapter(engine.load_adapter(adapter, "global"))
        started = time.perf_counter()
        results = []
        for prompt in prompts if greedy else ():
            text = generate(engine, prompt, max_tokens=task.default_max_tokens, stop=task.stop_strings).text
            logits = np.asarray(engine.prefill(engine.tokenize(prompt)).logits, dtype=np.float64)
            logits -= logits.max()
            results.append((text.strip(), logits - np.log(np.exp(logits).sum())))
        seconds = time.perf_counter() - started
        gold = []
        for prompt, output in zip(prompts, outputs, strict=True):
            continuation = engine.tokenize(" " + task.scored_output(output), add_bos=False)
            gold.extend(engine.score(engine.tokenize(prompt), [continuation])[0].logprobs)
        return results, seconds, float(np.mean(gold))
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--embedding", choices=sorted(TYPES), default="iq4_nl")
    parser.add_argument("--body", choices=sorted(BODY_TYPES), default="q4_k_m")
    parser.add_argument(
        "--backbone-alone",
        action="store_true",
        help="also score the headlines on both backbones without the adapter",
    )
    parser.add_argument("--out", type=Path, default=Path("/tmp/localpers-requantized.gguf"))
    parser.add_argument("--authors", type=int, default=40)
    parser.add_argument("--items", type=int, default=2)
    parser.add_argument(
        "--bundle", type=Path, default=None, help="bundle directory (default: the demo bundle)"
    )
    args = parser.parse_args()
    shipped = resolve_backbone().path
    requantize(shipped, args.out, args.embedding, args.body)
    adapter = (args.bundle or default_bundle_dir()) / "adapters" / "global.gguf"
    task = get_task("headline")
    lines = args.data.read_text(encoding="utf-8").splitlines()[: args.authors]
    histories = [json.loads(line)["history"] for line in lines if line.strip()]
    items = [item for history in histories for item in history[-args.items :]]
    prompts = [task.prompt_for(item["input"]) for item in items]
    outputs = [item["output"] for item in items]
    before, seconds_before, gold_before = run(shipped, adapter, prompts, outputs)
    after, seconds_after, gold_after = run(args.out, adapter, prompts, outputs)
    same = sum(a[0] == b[0] for a, b in zip(before, after, strict=True))
    agree = sum(int(np.argmax(a[1]) == np.argmax(b[1])) for a, b in zip(before, after, strict=True))
    kl = [float(np.sum(np.exp(a[1]) * (a[1] - b[1]))) for a, b in zip(before, after, strict=True)]
    print(
        f"token_embd {args.embedding}, body {args.body}: {len(prompts)} prompts, identical greedy headlines {same},"
        f" first token's argmax agrees {agree}, mean KL {np.mean(kl):.4f} (max {np.max(kl):.4f}); {seconds_before:.1f} s"
        f" shipped, {seconds_after:.1f} s re-quantized ({args.out}); the authors' headlines, log p/token with the"
        f" adapter: {gold_before:.4f} shipped, {gold_after:.4f} re-quantized"
    )
    if args.backbone_alone:
        bare_before = run(shipped, None, prompts, outputs, greedy=False)[2]
        bare_after = run(args.out, None, prompts, outputs, greedy=False)[2]
        print(f"the backbone alone: {bare_before:.4f} shipped, {bare_after:.4f} re-quantized")


if __name__ == "__main__":
    main()
