"""Would contrasting the history-conditioned prompt with a plain one help? A teacher-forced check on the dev split.

Context-aware decoding with the user's history as the context: the next token comes from
`(1 + a) * log p(y | conditioned prompt) - a * log p(y | plain prompt)`, restricted (as CoPe does) to tokens
within `tau` = 0.1 of the conditioned model's best. For each dev query this scores the author's real headline
teacher-forced three times (cluster adapter with the device's conditioned prompt, the same adapter with the plain
prompt, the global adapter with the plain prompt) and reports, per contrast strength `a` and base, the mean gold
log-probability per token and how often the contrast's top token is the gold token. Nothing is generated, and
nothing here is part of the product: docs/RESULTS.md section 0g has the figures and the verdict.

    python scripts/contrast_likelihood.py --queries 2 --json
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from localpers.bench.data import load_bench_users
from localpers.methods.card.personalizer import Personalizer
from localpers.tasks import get_task
from localpers.users.history_index import HistoryIndex

STRENGTHS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5)
TAU = 0.1


def log_softmax_rows(logits: np.ndarray) -> np.ndarray:
    rows = logits.astype(np.float64)
    peak = rows.max(axis=1, keepdims=True)
    return rows - (peak + np.log(np.exp(rows - peak).sum(axis=1, keepdims=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data/news-headlines/train.jsonl")
    parser.add_argument("--queries", type=int, default=2, help="dev queries per author")
    parser.add_argument("--max-users", type=int, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    users = load_bench_users(args.data, dev_split=True, max_queries=args.queries, max_users=args.max_users)
    personalizer = Personalizer.open(n_threads=args.threads)
    engine = personalizer.engine
    task = get_task("headline")
    likelihood = {base: {a: [] for a in STRENGTHS} for base in ("cluster-plain", "global-plain")}
    agreement = {base: {a: [] for a in STRENGTHS} for base in likelihood}
    for user in users:
        cluster, _ = personalizer.assign_cluster([item.output for item in user.history])
        adapter = personalizer.bundle.cluster_adapter_name(cluster)
        index = HistoryIndex(task, [(item.input, item.output) for item in user.history])
        for query in user.queries:
            conditioned, _ = personalizer.prompt_tokens("headline", query.input, "cluster", index)
            plain, _ = personalizer.prompt_tokens("headline", query.input, "global", None)
            gold = engine.tokenize(" " + query.reference.strip() + "\n", add_bos=False)
            engine.set_adapter(adapter)
            with_history = log_softmax_rows(engine.score(conditioned, [gold], keep_logits=True)[0].logits)
            bases = {"cluster-plain": engine.score(plain, [gold], keep_logits=True)[0].logits}
            engine.set_adapter("global")
            bases["global-plain"] = engine.score(plain, [gold], keep_logits=True)[0].logits
            targets = np.asarray(gold)
            rows = np.arange(len(targets))
            plausible = with_history >= with_history.max(axis=1, keepdims=True) + np.log(TAU)
            for base, logits in bases.items():
                without = log_softmax_rows(logits)
                for a in STRENGTHS:
                    mixed = log_softmax_rows((1 + a) * with_history - a * without)
                    likelihood[base][a].append(float(mixed[rows, targets].mean()))
                    top = np.where(plausible, mixed, -np.inf).argmax(axis=1)
                    agreement[base][a].append(float((top == targets).mean()))
    summary = {
        base: {
            str(a): {
                "gold_logprob": round(float(np.mean(likelihood[base][a])), 4),
                "top1_agreement": round(float(np.mean(agreement[base][a])), 4),
            }
            for a in STRENGTHS
        }
        for base in likelihood
    }
    if args.json:
        print(json.dumps(summary, indent=1))
        return
    for base, row in summary.items():
        print(
            base,
            " ".join(f"a={a}: {v['gold_logprob']:.3f}/{v['top1_agreement']:.3f}" for a, v in row.items()),
        )


if __name__ == "__main__":
    main()
