"""Does the global adapter personalize more at another LoRA scale? A teacher-forced check on the dev split.

llama.cpp applies an adapter at a scale (`Engine.set_adapter(name, scale)`; 1 is the trained update). Below 1 the
output moves toward the untrained backbone, above 1 the fine-tune is extrapolated. For each dev query this scores
the author's real headline teacher-forced with the bundle's global adapter at every scale, once with the device's
history prompt (the user's recent and closest headlines) and once with the plain prompt, and reports per scale the
mean gold log-probability per token of each, the history prompt's edge over the plain one (the personalization
the scale leaves), and how often the top token is the gold token. Nothing is generated, and nothing here is part
of the product: docs/RESULTS.md section 0zc has the figures and the verdict.

    python scripts/adapter_scale.py --bundle ../bundle-a --queries 2 --json
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from scipy.special import log_softmax

from localpers.bench.data import load_bench_users
from localpers.methods.card.personalizer import Personalizer
from localpers.tasks import get_task
from localpers.users.history_index import HistoryIndex

SCALES = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
PROMPTS = ("history", "plain")


def summarise(
    likelihood: dict[tuple[float, str], list[float]], agreement: dict[tuple[float, str], list[float]]
) -> dict[str, dict[str, float]]:
    """Per scale: mean gold log p/token under each prompt, the history prompt's mean edge, top-1 agreement."""
    summary = {}
    for scale in sorted({scale for scale, _ in likelihood}):
        history = np.asarray(likelihood[(scale, "history")])
        plain = np.asarray(likelihood[(scale, "plain")])
        summary[str(scale)] = {
            "gold_logprob_history": round(float(history.mean()), 4),
            "gold_logprob_plain": round(float(plain.mean()), 4),
            "history_edge": round(float((history - plain).mean()), 4),
            "top1_history": round(float(np.mean(agreement[(scale, "history")])), 4),
            "top1_plain": round(float(np.mean(agreement[(scale, "plain")])), 4),
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data/news-headlines/train.jsonl")
    parser.add_argument("--bundle", default=None, help="bundle directory (default: the demo bundle)")
    parser.add_argument("--queries", type=int, default=2, help="dev queries per author")
    parser.add_argument("--max-users", type=int, default=None)
    parser.add_argument("--scales", default=",".join(str(s) for s in SCALES), help="comma-separated scales")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    scales = [float(part) for part in args.scales.split(",")]

    users = load_bench_users(args.data, dev_split=True, max_queries=args.queries, max_users=args.max_users)
    personalizer = Personalizer.open(bundle=args.bundle, n_threads=args.threads)
    engine = personalizer.engine
    task = get_task("headline")
    likelihood: dict[tuple[float, str], list[float]] = {(s, p): [] for s in scales for p in PROMPTS}
    agreement: dict[tuple[float, str], list[float]] = {(s, p): [] for s in scales for p in PROMPTS}
    for user in users:
        index = HistoryIndex(task, [(item.input, item.output) for item in user.history])
        for query in user.queries:
            prompts = {
                "history": personalizer.prompt_tokens("headline", query.input, "global-history", index)[0],
                "plain": personalizer.prompt_tokens("headline", query.input, "global", None)[0],
            }
            gold = engine.tokenize(" " + query.reference.strip() + "\n", add_bos=False)
            targets = np.asarray(gold)
            rows = np.arange(len(targets))
            for scale in scales:
                engine.set_adapter("global", scale)
                for name, prompt in prompts.items():
                    scored = engine.score(prompt, [gold], keep_logits=True)[0]
                    logprobs = log_softmax(scored.logits.astype(np.float64), axis=1)
                    likelihood[(scale, name)].append(float(logprobs[rows, targets].mean()))
                    agreement[(scale, name)].append(float((logprobs.argmax(axis=1) == targets).mean()))
    summary = summarise(likelihood, agreement)
    if args.json:
        print(json.dumps(summary, indent=1))
        return
    print("scale  log p history  log p plain  history edge  top-1 history  top-1 plain")
    for scale, row in summary.items():
        print(
            f"{scale:>5}  {row['gold_logprob_history']:>13.4f}  {row['gold_logprob_plain']:>11.4f}  "
            f"{row['history_edge']:>12.4f}  {row['top1_history']:>13.4f}  {row['top1_plain']:>11.4f}"
        )


if __name__ == "__main__":
    main()
