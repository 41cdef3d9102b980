"""Experiment: can the user's own evidence pick a better one of `--candidates 16`'s candidates than consensus?

Reads the candidates `scripts/self_targets.py generate` saved (greedy + 15 samples per query, with the author's
headline) and the bench JSONL they came from (for each user's history and each query's article).

- `score` adds, per candidate, its mean per-token log-probability under the conditioned prompt (the user's
  examples) and under the plain prompt, both with the bundle's global adapter, teacher-forced as
  `localpers rewrite` decodes (resumable: rows already in OUT are skipped). Their difference is how much the
  user's examples raise the candidate (a pointwise mutual information with the history).
- `evaluate` scores each selection rule against the author's headline: greedy, consensus (what the product
  returns; also among the greedy candidate and its first 3, 7 or 11 samples only), the oracle (the closest
  candidate, a ceiling), consensus plus one feature at a weight, and learned rerankers (ridge and gradient
  boosting on all features, cross-validated by author so that no author's choice is learned from that
  author's own queries).

- `compare` pairs two candidate files of the same items (e.g. samples at two temperatures): the consensus of
  the greedy candidate and its first 3, 7, 11 or 15 samples in each, against the first file's greedy one.

Nothing here changes the product.

    python scripts/rerank_candidates.py score ../mbrd/cands.jsonl --data ../mbrd/queries.jsonl \
        --bundle ../bundle-a --out ../rr/scores.jsonl --limit 160
    python scripts/rerank_candidates.py evaluate ../mbrd/cands.jsonl --data ../mbrd/queries.jsonl \
        [--scores ../rr/scores.jsonl]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from localpers.bench.data import load_bench_users
from localpers.methods.consensus import choose_consensus, unigram_f1, unigrams

ARTICLE_MARK = "Generate a headline for the following article:"


def load_rows(candidates: Path, data: Path) -> list[tuple[dict, object, list[str]]]:
    """(candidate row, bench query, the user's history headlines) for every saved row."""
    users = {user.user_id: user for user in load_bench_users(data)}
    rows = []
    for row in map(json.loads, candidates.open()):
        user = users[row["user"]]
        query = next(q for q in user.queries if q.id == row["query_id"])
        rows.append((row, query, [item.output for item in user.history]))
    return rows


FEATURES = (
    "consensus",
    "greedy",
    "words",
    "words_off_median",
    "article_share",
    "history_share",
    "history_only_share",
    "history_best_f1",
    "recent_mean_f1",
    "question_habit",
    "colon_habit",
    "logp_history",
    "logp_plain",
    "pmi",
)


def candidate_features(row: dict, query: object, history: list[str], scores: dict | None) -> np.ndarray:
    """One row of FEATURES per candidate (the log-probability columns are 0 without `scores`)."""
    texts = row["candidates"]
    counts = [unigrams(t) for t in texts]
    n = len(texts)
    agreement = [np.mean([unigram_f1(counts[i], counts[j]) for j in range(n) if j != i]) for i in range(n)]
    article = unigrams(query.input.replace(ARTICLE_MARK, ""))
    past = [unigrams(h) for h in history]
    seen: Counter[str] = Counter()
    for words in past:
        seen.update(set(words))
    median = float(np.median([sum(w.values()) for w in past])) if past else 12.0
    recent = past[-5:]
    question = np.mean([h.strip().endswith("?") for h in history]) if history else 0.0
    colon = np.mean([":" in h for h in history]) if history else 0.0
    table = []
    for i, text in enumerate(texts):
        words = counts[i]
        total = max(1, sum(words.values()))
        table.append(
            [
                agreement[i],
                float(i == 0),
                total,
                abs(total - median),
                sum(v for w, v in words.items() if w in article) / total,
                sum(v for w, v in words.items() if w in seen) / total,
                sum(v for w, v in words.items() if w in seen and w not in article) / total,
                max((unigram_f1(words, p) for p in past), default=0.0),
                float(np.mean([unigram_f1(words, p) for p in recent])) if recent else 0.0,
                float(text.strip().endswith("?")) * (question - 0.5),
                float(":" in text) * (colon - 0.5),
                scores["history"][i] if scores else 0.0,
                scores["plain"][i] if scores else 0.0,
                scores["history"][i] - scores["plain"][i] if scores else 0.0,
            ]
        )
    return np.array(table)


def score(args: argparse.Namespace) -> None:
    from consensus_offline import pending_queries

    from localpers.methods.card.personalizer import Personalizer

    wanted = {
        (r["user"], r["query_id"]): r for r in list(map(json.loads, args.candidates.open()))[: args.limit]
    }
    personalizer = Personalizer.open(bundle=args.bundle, n_threads=args.threads)
    with args.out.open("a") as sink:
        for user, index, query in pending_queries(args.out, load_bench_users(args.data)):
            row = wanted.get((user.user_id, query.id))
            if row is None:
                continue
            result = {"user": row["user"], "query_id": row["query_id"]}
            for name, method in (("history", "global-history"), ("plain", "global")):
                result[name] = [
                    personalizer.score_reference(query.input, text or " ", method=method, history=index)
                    for text in row["candidates"]
                ]
            sink.write(json.dumps(result) + "\n")
            sink.flush()
            print(f"{row['user']} {row['query_id']} ({len(wanted)} rows wanted)", file=sys.stderr, flush=True)


def evaluate(args: argparse.Namespace) -> None:
    from scipy.stats import spearmanr
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.linear_model import Ridge
    from sklearn.model_selection import GroupKFold

    scores = {}
    if args.scores:
        scores = {(r["user"], r["query_id"]): r for r in map(json.loads, args.scores.open())}
    rows = [
        r
        for r in load_rows(args.candidates, args.data)
        if not scores or (r[0]["user"], r[0]["query_id"]) in scores
    ]
    tables = [candidate_features(r, q, h, scores.get((r["user"], r["query_id"]))) for r, q, h in rows]
    gold = [
        np.array([unigram_f1(unigrams(t), unigrams(r["reference"])) for t in r["candidates"]])
        for r, _, _ in rows
    ]
    authors = np.array([r["user"] for r, _, _ in rows])
    columns = [i for i, name in enumerate(FEATURES) if scores or not name.startswith(("logp", "pmi"))]

    def picked(choose) -> float:  # noqa: ANN001 - a callable from a feature table to a candidate index
        return float(np.mean([g[choose(t)] for t, g in zip(tables, gold, strict=True)]))

    consensus = picked(lambda t: int(np.argmax(t[:, 0])))
    print(f"{len(rows)} queries, {len(set(authors))} authors")
    print(f"greedy     {picked(lambda t: 0):.4f}")
    print(f"consensus  {consensus:.4f}")
    print(f"oracle     {float(np.mean([g.max() for g in gold])):.4f}")
    for first in (4, 8, 12):  # consensus among the greedy candidate and the first samples only
        value = float(
            np.mean(
                [
                    g[choose_consensus(r["candidates"][:first]).index]
                    for (r, _, _), g in zip(rows, gold, strict=True)
                ]
            )
        )
        print(f"consensus of the first {first:>2} {value:.4f}")
    for column in columns:
        # how well the feature orders one query's candidates by their ROUGE-1 against the author's headline
        rho = [
            spearmanr(t[:, column], g).statistic
            for t, g in zip(tables, gold, strict=True)
            if np.std(g) > 0 and np.std(t[:, column]) > 0
        ]
        print(f"within-query Spearman of {FEATURES[column]:<20} {np.mean(rho):+.3f}")
    for column in columns[1:]:
        spread = np.std(np.concatenate([t[:, column] for t in tables])) or 1.0
        line = []
        for weight in (-0.5, -0.2, -0.1, 0.1, 0.2, 0.5):
            w = weight * 0.1 / spread  # 0.1 of consensus's own scale per standard deviation of the feature
            value = picked(lambda t, c=column, w=w: int(np.argmax(t[:, 0] + w * t[:, c])))
            line.append(f"{weight:+.1f}:{value - consensus:+.4f}")
        print(f"consensus + {FEATURES[column]:<20} " + " ".join(line))
    learners = {
        "ridge": lambda: Ridge(alpha=1.0),
        "boosting": lambda: HistGradientBoostingRegressor(
            max_iter=200, learning_rate=0.05, max_leaf_nodes=15, min_samples_leaf=40
        ),
    }
    for name, make in learners.items():
        got = np.zeros(len(rows))
        for train, test in GroupKFold(5).split(np.zeros(len(rows)), groups=authors):
            x = np.vstack([tables[i][:, columns] for i in train])
            y = np.concatenate([gold[i] - gold[i].mean() for i in train])
            model = make().fit(x, y)
            for i in test:
                got[i] = gold[i][int(np.argmax(model.predict(tables[i][:, columns])))]
        print(f"{name:<10} {got.mean():.4f} (cross-validated by author)")


def compare(args: argparse.Namespace) -> None:
    """Consensus of the first n candidates in two candidate files of the same items, paired per item."""
    from localpers.bench.metrics import paired_bootstrap

    reference = {(r["user"], r["query_id"]): r for r in map(json.loads, args.reference.open())}
    other = list(map(json.loads, args.other.open()))
    base = [reference[(r["user"], r["query_id"])] for r in other]

    def scores(rows: list[dict], first: int) -> list[float]:
        chosen = [r["candidates"][choose_consensus(r["candidates"][:first]).index] for r in rows]
        return [unigram_f1(unigrams(c), unigrams(r["reference"])) for c, r in zip(chosen, rows, strict=True)]

    def shown(interval: object) -> str:
        return f"{interval.mean:+.4f} [{interval.low:+.4f}, {interval.high:+.4f}]"

    greedy = scores(base, 1)
    same = sum(a["candidates"][0] == b["candidates"][0] for a, b in zip(base, other, strict=True))
    print(f"{len(other)} items, the greedy candidate identical in {same}; greedy R-1 {np.mean(greedy):.4f}")
    for first in (4, 8, 12, 16):
        mine, theirs = scores(base, first), scores(other, first)
        print(
            f"{first:>2} candidates: {args.reference.name} {np.mean(mine):.4f} "
            f"{shown(paired_bootstrap(mine, greedy))} vs greedy; {args.other.name} {np.mean(theirs):.4f} "
            f"{shown(paired_bootstrap(theirs, greedy))} vs greedy, {shown(paired_bootstrap(theirs, mine))} vs the first file"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    scoring = commands.add_parser("score")
    scoring.add_argument("candidates", type=Path)
    scoring.add_argument("--data", type=Path, required=True)
    scoring.add_argument("--bundle", type=Path, required=True)
    scoring.add_argument("--out", type=Path, required=True)
    scoring.add_argument("--limit", type=int, default=None)
    scoring.add_argument("--threads", type=int, default=2)
    evaluation = commands.add_parser("evaluate")
    evaluation.add_argument("candidates", type=Path)
    evaluation.add_argument("--data", type=Path, required=True)
    evaluation.add_argument("--scores", type=Path, default=None)
    pairing = commands.add_parser("compare")
    pairing.add_argument(
        "reference", type=Path, help="candidates of one sampling (its greedy is the baseline)"
    )
    pairing.add_argument("other", type=Path, help="candidates of the same items, another sampling")
    args = parser.parse_args()
    {"score": score, "evaluate": evaluate, "compare": compare}[args.command](args)


if __name__ == "__main__":
    main()
