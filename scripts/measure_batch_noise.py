"""Measure llama.cpp's batch-vs-single-token numeric noise under each CPU buffer setting.

The engine tests compare a continuation's log-probs seen while generating token by token with the same
continuation scored teacher-forced in one batch. llama.cpp's CPU kernels differ between the two (GEMV vs
GEMM, repacked vs plain blocks, activation quantisation per batch), so the numbers are close, not equal.
This script measures how close, per setting, over the demo user's articles, so a test tolerance can be
argued from data: it prints the max and 99th percentile of |single - batched| per token, in nats.
Usage: python scripts/measure_batch_noise.py [--settings auto plain] [--articles 24] [--tokens 12] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from localpers.engine import Engine
from localpers.engine.backbone import resolve_backbone
from localpers.engine.cpu_buffers import ENV_VAR
from localpers.engine.generation import generate
from localpers.tasks import get_task

ARTICLES = Path(__file__).resolve().parents[1] / "models" / "demo-user" / "articles.jsonl"
HISTORY = Path(__file__).resolve().parents[1] / "models" / "demo-user" / "history.jsonl"


def prompts(limit: int) -> list[str]:
    task = get_task("headline")
    texts = []
    for path in (ARTICLES, HISTORY):
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                texts.append(task.prompt_for(row.get("input") or row.get("text") or ""))
    return texts[:limit]


def measure(setting: str, texts: list[str], tokens: int) -> dict[str, float]:
    os.environ[ENV_VAR] = setting
    engine = Engine(resolve_backbone(None).path, n_ctx=512, tap_layers=None, n_threads=1)
    os.environ.pop(ENV_VAR, None)
    gaps: list[float] = []
    try:
        for text in texts:
            prompt = engine.tokenize(text)
            result = generate(engine, prompt, max_tokens=tokens, stop=())
            if not result.tokens:
                continue
            step = engine.prefill(prompt)
            seen = []
            for token in result.tokens:
                logits = step.logits.astype(np.float64)
                peak = logits.max()
                seen.append(logits[token] - peak - np.log(np.exp(logits - peak).sum()))
                step = engine.step(token)
            (scored,) = engine.score(prompt, [result.tokens])
            gaps.extend(np.abs(scored.logprobs - np.asarray(seen)).tolist())
    finally:
        engine.close()
    values = np.asarray(gaps)
    return {
        "tokens": int(values.size),
        "max": round(float(values.max()), 4),
        "p99": round(float(np.percentile(values, 99)), 4),
        "mean": round(float(values.mean()), 5),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", default=["auto", "plain"])
    parser.add_argument("--articles", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=12)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    texts = prompts(args.articles)
    report = {setting: measure(setting, texts, args.tokens) for setting in args.settings}
    print(json.dumps(report, indent=2) if args.json else "\n".join(f"{k}: {v}" for k, v in report.items()))


if __name__ == "__main__":
    main()
