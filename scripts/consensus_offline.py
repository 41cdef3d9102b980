"""Offline study of choosing among candidates (RESULTS 0o): save greedy + N samples per query, then score rules.

`generate` writes, per dev query of the train authors (`--dev-split`'s protocol), the conditioned global
adapter's greedy headline and N samples (one `Personalizer.rewrite` each, temperature T, top-p 0.95, seeds
1000..1000+N-1) with the user's history index, as JSONL; it resumes where a file stops. `analyse` reads such a
file and compares selection rules against the greedy output (paired bootstrap over queries): the oracle (best
candidate by the author's headline), consensus (highest mean ROUGE-1 against the other candidates), consensus
among the samples only, consensus plus the user's history as extra evidence (mean of the top-5 ROUGE-1 against
their 20 most recent headlines, times a weight), the history term alone, and the first sample.

    python scripts/consensus_offline.py generate ../mbr/cands-t07.jsonl --bundle ../bundle-a --users 20 --samples 8
    python scripts/consensus_offline.py generate ../mbr/cands-rest.jsonl --bundle ../bundle-a --skip 20 --users 35 \
        --samples 16
    python scripts/consensus_offline.py analyse ../mbr/cands-rest.jsonl --samples 8 12 15 16

The product's own path (`localpers rewrite --candidates N`, batched, top-k 64 before top-p) is measured by
`localpers bench -m card-auto@candidates=16`; this script only chose what to build.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from localpers.bench.data import BenchQuery, BenchUser, load_bench_users
from localpers.bench.methods import UserProfile
from localpers.bench.metrics import paired_bootstrap
from localpers.bench.prompt_methods import history_index
from localpers.engine.decoding import SamplerSettings
from localpers.methods.consensus import unigram_f1, unigrams
from localpers.users.history_index import HistoryIndex

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "news-headlines" / "train.jsonl"
HISTORY_WEIGHTS = (0.25, 0.5, 1.0, 2.0)


def generate(args: argparse.Namespace) -> None:
    from localpers.methods.card.personalizer import Personalizer

    users = load_bench_users(args.data, max_queries=5, dev_split=True)[args.skip : args.skip + args.users]
    personalizer = Personalizer.open(bundle=args.bundle, n_threads=args.threads)
    with args.out.open("a") as sink:
        for user, index, query in pending_queries(args.out, users):
            texts = [personalizer.rewrite(query.input, method="global-history", history=index).text]
            for sample in range(args.samples):
                sampling = SamplerSettings(temperature=args.temperature, top_p=0.95, seed=1000 + sample)
                texts.append(
                    personalizer.rewrite(
                        query.input, method="global-history", history=index, sampling=sampling
                    ).text
                )
            row = {
                "user": user.user_id,
                "query_id": query.id,
                "reference": query.reference,
                "history": [item.output for item in user.history],
                "candidates": [{"text": text} for text in texts],
            }
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            print(user.user_id, query.id, file=sys.stderr, flush=True)


def pending_queries(
    out: Path, users: list[BenchUser]
) -> Iterator[tuple[BenchUser, HistoryIndex, BenchQuery]]:
    """(user, their history index, query) for each query not yet in `out` (JSONL rows with user and query_id).

    What lets a generation script resume where its file stops.
    """
    done = set()
    if out.exists():
        done = {(row["user"], row["query_id"]) for row in map(json.loads, out.open())}
    for user in users:
        index = history_index(UserProfile(name=user.store_name, items=user.history))
        for query in user.queries:
            if (user.user_id, query.id) not in done:
                yield user, index, query


def rule_choices(texts: list[str], reference: str, history: list[str]) -> tuple[list[float], dict[str, int]]:
    """Each candidate's ROUGE-1 against the reference, and the index each rule picks."""
    counts = [unigrams(text) for text in texts]
    gold = [unigram_f1(c, unigrams(reference)) for c in counts]
    n = len(texts)
    agreement = np.array(
        [np.mean([unigram_f1(counts[i], counts[j]) for j in range(n) if j != i]) for i in range(n)]
    )
    recent = [unigrams(h) for h in history[-20:]]
    closeness = np.array(
        [
            np.mean(sorted((unigram_f1(c, h) for h in recent), reverse=True)[:5]) if recent else 0.0
            for c in counts
        ]
    )
    rules = {
        "greedy": 0,
        "oracle": int(np.argmax(gold)),
        "consensus": int(np.argmax(agreement)),
        "consensus, samples only": 1 + int(np.argmax(agreement[1:])),
        "history alone": int(np.argmax(closeness)),
        "first sample": 1,
    }
    for weight in HISTORY_WEIGHTS:
        rules[f"consensus + history x{weight}"] = int(np.argmax(agreement + weight * closeness))
    return gold, rules


def analyse(args: argparse.Namespace) -> None:
    rows = [json.loads(line) for line in args.candidates.open()]
    for samples in args.samples:
        scores: dict[str, list[float]] = {}
        for row in rows:
            texts = [c["text"] for c in row["candidates"]][: samples + 1]
            gold, rules = rule_choices(texts, row["reference"], row["history"])
            for name, index in rules.items():
                scores.setdefault(name, []).append(gold[index])
        greedy = scores["greedy"]
        print(f"greedy + {samples} samples, {len(rows)} queries")
        for name, values in scores.items():
            line = f"  {name:28s} R-1 {np.mean(values):.4f}"
            if name != "greedy":
                delta = paired_bootstrap(values, greedy)
                line += f"  vs greedy {delta.mean:+.4f} [{delta.low:+.4f}, {delta.high:+.4f}]"
            print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("generate")
    make.add_argument("out", type=Path)
    make.add_argument("--data", type=Path, default=DATA)
    make.add_argument("--bundle", required=True)
    make.add_argument("--users", type=int, default=20)
    make.add_argument("--skip", type=int, default=0)
    make.add_argument("--samples", type=int, default=8)
    make.add_argument("--temperature", type=float, default=0.7)
    make.add_argument("--threads", type=int, default=2)
    study = commands.add_parser("analyse")
    study.add_argument("candidates", type=Path)
    study.add_argument("--samples", type=int, nargs="+", default=[8, 16])
    args = parser.parse_args()
    generate(args) if args.command == "generate" else analyse(args)


if __name__ == "__main__":
    main()
