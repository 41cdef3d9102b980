"""Experiment: training targets chosen among the adapter's own candidates (self-distillation, issue 20).

`queries` turns a training corpus into a bench JSONL (each author's last min(16, n/3) items as queries).
`generate` decodes, for every query of a bench JSONL (`user_id`, `history`, `queries`), the conditioned global
adapter's 16 candidates exactly as `localpers rewrite --candidates 16` does (greedy + 15 samples side by side),
and saves all of them with the author's headline and the prompt the device built
(what `scripts/train_preference.py` trains on). `corpus` writes a training corpus: the source corpus with
each generated query's output replaced by one candidate, chosen by a rule:

- `consensus`: the candidate the others agree with most (what `--candidates` returns; minimum Bayes risk);
- `oracle`: the candidate closest to the author's own headline (ROUGE-1), i.e. the best headline the adapter
  itself can reach for that author.

With `--gold-share S`, a stable share S of the items (hashed by user and id) keeps the author's own headline
instead (self-targets mixed with gold, so the adapter is not pulled off the authors' distribution). It also
writes the listed items (user id, tab, output; `OUT` with suffix `.items`), which
`scripts/train_weighted.py --only-items` trains on.
Nothing here changes the product.

    python scripts/self_targets.py queries ../train-heldout.jsonl ../mbrd/queries.jsonl
    python scripts/self_targets.py generate ../mbrd/cands.jsonl --data ../mbrd/queries.jsonl --bundle ../bundle-a
    python scripts/self_targets.py generate ../rr/cands-t05.jsonl --data ../mbrd/queries.jsonl --bundle ../bundle-a \
        --temperature 0.5
    python scripts/self_targets.py corpus ../mbrd/cands.jsonl ../train-heldout.jsonl ../mbrd/oracle.jsonl \
        --rule oracle
    python scripts/self_targets.py corpus ../mbrd/cands.jsonl ../train-heldout.jsonl ../mbrd/cons-g50.jsonl \
        --rule consensus --gold-share 0.5
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
from consensus_offline import pending_queries

from localpers.bench.data import load_bench_users
from localpers.methods.card import decoding_runs
from localpers.methods.consensus import unigram_f1, unigrams


def queries(args: argparse.Namespace) -> None:
    """A bench JSONL from a training corpus: each author's last min(N, n/3) items as queries, the rest as history."""
    count = 0
    with args.out.open("w") as sink:
        for line in args.source.open():
            record = json.loads(line)
            items = record["history"]
            n = min(args.per_author, len(items) // 3)
            if n < 1:
                continue
            sink.write(
                json.dumps({"user_id": record["user_id"], "history": items[:-n], "queries": items[-n:]})
                + "\n"
            )
            count += n
    print(f"{count} queries", file=sys.stderr)


def generate(args: argparse.Namespace) -> None:
    from localpers.methods.card.personalizer import Personalizer

    seen: list[list[str]] = []
    original = decoding_runs.choose_consensus

    def recording_choice(texts: list[str]) -> object:
        seen.append(list(texts))
        return original(texts)

    decoding_runs.choose_consensus = recording_choice
    # the samples' temperature instead of the product's (decoding_runs.candidate_sampling)
    if args.temperature is not None:
        for name in ("CANDIDATE_SAMPLING", "FEW_CANDIDATE_SAMPLING"):
            settings = dataclasses.replace(getattr(decoding_runs, name), temperature=args.temperature)
            setattr(decoding_runs, name, settings)
    users = load_bench_users(args.data)
    personalizer = Personalizer.open(bundle=args.bundle, n_threads=args.threads)
    total = sum(len(user.queries) for user in users)
    with args.out.open("a") as sink:
        for user, index, query in pending_queries(args.out, users):
            seen.clear()
            result = personalizer.rewrite(
                query.input, method=args.method, history=index, candidates=args.candidates
            )
            texts = seen[0]
            row = {
                "user": user.user_id,
                "query_id": query.id,
                "reference": query.reference,
                "chosen": result.text,
                "candidates": texts,
                "prompt": personalizer.prompt_for("headline", query.input, args.method, index),
            }
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            print(f"{user.user_id} {query.id} ({total} queries in the file)", file=sys.stderr, flush=True)


def choose(rule: str, texts: list[str], reference: str) -> int:
    counts = [unigrams(text) for text in texts]
    if rule == "oracle":
        gold = unigrams(reference)
        return int(np.argmax([unigram_f1(c, gold) for c in counts]))
    agreement = [
        np.mean([unigram_f1(counts[i], counts[j]) for j in range(len(texts)) if j != i])
        for i in range(len(texts))
    ]
    return int(np.argmax(agreement))


def keeps_gold(user: str, query_id: str, share: float) -> bool:
    """Whether this item keeps the author's own headline: a stable hash of (user, id) below `share`."""
    digest = hashlib.sha256(f"{user}\t{query_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def corpus(args: argparse.Namespace) -> None:
    chosen: dict[tuple[str, str], str] = {}
    gains = []
    kept_gold = 0
    for row in map(json.loads, args.candidates.open()):
        if keeps_gold(row["user"], row["query_id"], args.gold_share):
            chosen[(row["user"], row["query_id"])] = row["reference"].strip()
            kept_gold += 1
            continue
        texts = [t for t in row["candidates"] if t.strip()] or [row["chosen"]]
        pick = texts[choose(args.rule, texts, row["reference"])].strip()
        chosen[(row["user"], row["query_id"])] = pick
        gold = unigrams(row["reference"])
        gains.append(unigram_f1(unigrams(pick), gold) - unigram_f1(unigrams(texts[0]), gold))
    replaced: list[str] = []
    with args.out.open("w") as sink:
        for line in args.source.open():
            record = json.loads(line)
            for item in record["history"]:
                key = (record["user_id"], item["id"])
                if key in chosen:
                    item["output"] = chosen[key]
                    replaced.append(f"{record['user_id']}\t{item['output']}")
            sink.write(json.dumps(record) + "\n")
    args.out.with_suffix(".items").write_text("\n".join(replaced) + "\n")
    gain = f"; {args.rule} candidate vs greedy R-1 against the author's headline {np.mean(gains):+.4f}"
    print(
        f"{len(replaced)} items listed, {kept_gold} of them with the author's own headline"
        + (gain if gains else ""),
        file=sys.stderr,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("queries")
    make.add_argument("source", type=Path)
    make.add_argument("out", type=Path)
    make.add_argument("--per-author", type=int, default=16)
    gen = commands.add_parser("generate")
    gen.add_argument("out", type=Path)
    gen.add_argument("--data", type=Path, required=True)
    gen.add_argument("--bundle", type=Path, required=True)
    gen.add_argument("--method", default="global-history")
    gen.add_argument("--candidates", type=int, default=16)
    gen.add_argument("--threads", type=int, default=2)
    gen.add_argument(
        "--temperature", type=float, default=None, help="the samples' temperature (default: the product's)"
    )
    build = commands.add_parser("corpus")
    build.add_argument("candidates", type=Path)
    build.add_argument("source", type=Path)
    build.add_argument("out", type=Path)
    build.add_argument("--rule", choices=("consensus", "oracle"), required=True)
    build.add_argument(
        "--gold-share",
        type=float,
        default=0.0,
        help="share of the items (hashed by user and id) that keep the author's own headline",
    )
    args = parser.parse_args()
    if args.command == "corpus" and not 0.0 <= args.gold_share <= 1.0:
        parser.error(f"--gold-share must be between 0 and 1, not {args.gold_share}")
    {"queries": queries, "generate": generate, "corpus": corpus}[args.command](args)


if __name__ == "__main__":
    main()
