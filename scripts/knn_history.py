"""Dev-split study of a kNN language model over the user's own history (RESULTS 0x).

kNN-LM (Khandelwal et al. 2020) with a per-user datastore: every token of the user's history headlines, keyed
by the conditioned global adapter's last-layer hidden state (`l_out` of the last layer, the engine's last tap)
when it predicted that token, the headline teacher-forced after the prompt the device would have shown then
(the user's recent and closest *earlier* headlines, `prompting.prompt_tokens`). At each decode step the state's
`--neighbours` nearest keys (cosine, after the datastore's mean is removed) vote for their tokens with weights
exp(cos / T); the next-token distribution is (1 - L) p_adapter + L p_knn, the usual interpolation. It is the
contextual form of 0v's `hcopy` (which pushed every word of the shown examples alike): a history token is pushed
only where the model is in a state like the one in which the author wrote it, from the whole history, not only
the five examples the prompt shows.

Two passes, both on the dev split (train authors' most recent queries; no test query is read):

- `likelihood`: the author's real headline teacher-forced on the device's prompt, its mean per-token
  log-probability under the adapter and under each interpolation of a grid (`--lambdas`, `--temperatures`),
  written to `OUT/likelihood.json`. Chooses the setting to decode with.
- `decode`: greedy decoding with the interpolation (candidates: the adapter's top k plus the neighbours'
  tokens), `OUT/cache/knn=L,T=T/<user>.json` in the bench's format, and `knn=0` (the adapter alone) beside it,
  so `scripts/compare_runs.py OUT:knn=0 OUT:knn=...` reads the paired difference.

Nothing here is used by the product; it resumes per user like `decode_variants.py`.

    python scripts/knn_history.py likelihood --bundle ../bundle-a --out ../bench-runs/dev29-knn-lik --max-users 6
    python scripts/knn_history.py decode --bundle ../bundle-a --out ../bench-runs/dev29-knn --max-queries 10 \
        --lambdas 0.25 --temperatures 0.05
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.special import log_softmax, logsumexp

from localpers.atomic import atomic_write_text
from localpers.bench.data import BenchUser, load_bench_users
from localpers.bench.metrics import rouge
from localpers.methods.card import prompting
from localpers.methods.card.decoding_runs import reference_tokens
from localpers.methods.card.personalizer import Personalizer
from localpers.tasks import get_task
from localpers.users.history_index import HistoryIndex

TOP_K = 20
DATASTORE_ITEMS = 60  # the most recent history items keyed (a device would key each item once, on import)


@dataclass
class Datastore:
    """One user's keys (unit vectors, mean removed) and the token each key's state was followed by."""

    mean: np.ndarray
    keys: np.ndarray  # (N, n_embd)
    tokens: np.ndarray  # (N,)

    def query(self, state: np.ndarray, neighbours: int) -> tuple[np.ndarray, np.ndarray]:
        """The nearest keys' cosine similarities and tokens, nearest first."""
        vector = state - self.mean
        vector = vector / (np.linalg.norm(vector) + 1e-9)
        sims = self.keys @ vector
        count = min(neighbours, len(sims))
        nearest = np.argpartition(-sims, count - 1)[:count]
        nearest = nearest[np.argsort(-sims[nearest])]
        return sims[nearest], self.tokens[nearest]


def knn_log_probs(sims: np.ndarray, tokens: np.ndarray, temperature: float) -> dict[int, float]:
    """log p_knn per voted token: softmax of similarity / T over the neighbours, summed per token."""
    weights = sims / temperature
    weights = weights - logsumexp(weights)
    votes: dict[int, list[float]] = {}
    for token, weight in zip(tokens.tolist(), weights.tolist(), strict=True):
        votes.setdefault(int(token), []).append(weight)
    return {token: float(logsumexp(ws)) for token, ws in votes.items()}


def mixed(log_lm: float, log_knn: float | None, lam: float) -> float:
    """log((1 - L) p_lm + L p_knn)."""
    if log_knn is None:
        return float(np.log1p(-lam) + log_lm) if lam < 1 else -np.inf
    return float(np.logaddexp(np.log1p(-lam) + log_lm, np.log(lam) + log_knn))


class Study:
    """The conditioned global adapter, its prompts, and per-user datastores."""

    def __init__(self, personalizer: Personalizer, tap: int = -1) -> None:
        self.personalizer = personalizer
        self.tap = tap  # which of the engine's tapped layers keys the store (-1: the last layer)
        self.engine = personalizer.engine
        self.task = get_task("headline")
        self.format = personalizer.prompt_format
        self.ends = set(personalizer.end_tokens)

    def prompt(self, text: str, index: HistoryIndex | None) -> tuple[list[int], int]:
        return prompting.prompt_tokens(
            self.engine, self.task.name, text, self.format if index else None, index
        )

    def datastore(self, user: BenchUser) -> Datastore:
        items = [i for i in user.history if i.task == self.task.name]
        keys, tokens = [], []
        for position in range(max(0, len(items) - DATASTORE_ITEMS), len(items)):
            earlier = items[:position]
            index = HistoryIndex(self.task, [(i.input, i.output) for i in earlier]) if earlier else None
            prompt, _ = self.prompt(items[position].input, index)
            gold = reference_tokens(self.engine, items[position].output)
            (scored,) = self.engine.score(prompt, [gold], logprob_rows=1)
            keys.append(scored.features[:, self.tap, :])
            tokens.extend(gold)
        raw = np.concatenate(keys, axis=0).astype(np.float64)
        mean = raw.mean(axis=0)
        centred = raw - mean
        centred /= np.linalg.norm(centred, axis=1, keepdims=True) + 1e-9
        return Datastore(mean, centred, np.asarray(tokens, dtype=np.int64))

    def index(self, user: BenchUser) -> HistoryIndex:
        return HistoryIndex(
            self.task, [(i.input, i.output) for i in user.history if i.task == self.task.name]
        )


def likelihood_pass(study: Study, users: list[BenchUser], args: argparse.Namespace) -> None:
    grid = [(lam, t) for lam in args.lambdas for t in args.temperatures]
    path = args.out / "likelihood.json"
    done = json.loads(path.read_text()) if path.exists() else {}
    for number, user in enumerate(users, start=1):
        if user.store_name in done:
            continue
        started = time.perf_counter()
        store = study.datastore(user)
        index = study.index(user)
        per_query = []
        for query in user.queries:
            prompt, _ = study.prompt(query.input, index)
            gold = reference_tokens(study.engine, query.reference)
            (scored,) = study.engine.score(prompt, [gold])
            rows = {"adapter": float(np.mean(scored.logprobs))}
            neighbourhoods = [
                store.query(scored.features[row, study.tap], args.neighbours) for row in range(len(gold))
            ]
            rows["knn_top_is_gold"] = float(
                np.mean(
                    [
                        max(knn_log_probs(sims, voted, 0.05).items(), key=lambda kv: kv[1])[0] == token
                        for (sims, voted), token in zip(neighbourhoods, gold, strict=True)
                    ]
                )
            )
            rows["gold_among_neighbours"] = float(
                np.mean([token in voted for (_, voted), token in zip(neighbourhoods, gold, strict=True)])
            )
            for lam, t in grid:
                total = 0.0
                for row, token in enumerate(gold):
                    sims, tokens = neighbourhoods[row]
                    knn = knn_log_probs(sims, tokens, t)
                    total += mixed(float(scored.logprobs[row]), knn.get(int(token)), lam)
                rows[f"L={lam},T={t}"] = total / len(gold)
            per_query.append(rows)
        done[user.store_name] = per_query
        atomic_write_text(path, json.dumps(done))
        print(f"{number}/{len(users)} {user.user_id} {time.perf_counter() - started:.0f}s", flush=True)
    names = list(next(iter(done.values()))[0])
    flat = {name: np.array([q[name] for qs in done.values() for q in qs]) for name in names}
    base = flat["adapter"]
    print(f"{len(base)} queries, adapter mean log p/token {base.mean():.4f}")
    print(
        f"the neighbours' top token is the author's next token {flat['knn_top_is_gold'].mean():.3f} "
        f"of the time (query mean); it is among them {flat['gold_among_neighbours'].mean():.3f}"
    )
    for name in names[3:]:
        delta = flat[name] - base
        print(f"{name:>16}: {flat[name].mean():.4f}  delta {delta.mean():+.4f}  up {np.mean(delta > 0):.2f}")


def decode_one(
    study: Study, prompt: list[int], shared: int, store: Datastore, lam: float, t: float, neighbours: int
) -> tuple[str, int]:
    engine = study.engine
    step = engine.prefill(prompt, shared=shared)
    tokens: list[int] = []
    for _ in range(study.task.default_max_tokens):
        scores = log_softmax(np.asarray(step.logits, dtype=np.float64))
        top = np.argpartition(-scores, TOP_K)[:TOP_K]
        if lam > 0:
            sims, voted = store.query(step.features[study.tap], neighbours)
            knn = knn_log_probs(sims, voted, t)
            candidates = np.unique(np.concatenate([top, np.fromiter(knn, dtype=np.int64)]))
            picked = np.array([mixed(float(scores[c]), knn.get(int(c)), lam) for c in candidates])
            token = int(candidates[np.argmax(picked)])
        else:
            token = int(top[np.argmax(scores[top])])
        if token in study.ends or engine.is_end_of_generation(token):
            break
        tokens.append(token)
        if "\n" in engine.detokenize(tokens):
            break
        step = engine.step(token)
    return engine.detokenize(tokens).split("\n")[0].strip(), len(tokens)


def decode_pass(study: Study, users: list[BenchUser], args: argparse.Namespace) -> None:
    settings = [(0.0, 0.0)] + [(lam, t) for lam in args.lambdas for t in args.temperatures]
    names = ["knn=0" if lam == 0 else f"knn={lam},T={t}" for lam, t in settings]
    started = time.perf_counter()
    for number, user in enumerate(users, start=1):
        files = [args.out / "cache" / name / f"{user.store_name}.json" for name in names]
        if all(f.exists() for f in files):
            continue
        store = study.datastore(user)
        index = study.index(user)
        records: list[list[dict]] = [[] for _ in names]
        for query in user.queries:
            prompt, shared = study.prompt(query.input, index)
            for slot, (lam, t) in enumerate(settings):
                text, n_tokens = decode_one(study, prompt, shared, store, lam, t, args.neighbours)
                records[slot].append(
                    {
                        "query_id": query.id,
                        "text": text,
                        "rouge1": round(rouge(text, query.reference).rouge1, 6),
                        "tokens": n_tokens,
                        "ms_per_token": 0.0,
                        "prompt_ms": 0.0,
                    }
                )
        for name, file, queries in zip(names, files, records, strict=True):
            file.parent.mkdir(parents=True, exist_ok=True)
            record = {"method": name, "user": user.store_name, "queries": queries}
            atomic_write_text(file, json.dumps(record, indent=1))
        print(f"{number}/{len(users)} {user.user_id} {time.perf_counter() - started:.0f}s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["likelihood", "decode"])
    parser.add_argument("--data", default="../shared/data/news-headlines/train.jsonl")
    parser.add_argument("--bundle", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-queries", type=int, default=10)
    parser.add_argument("--max-users", type=int, default=None)
    parser.add_argument("--neighbours", type=int, default=16)
    parser.add_argument("--lambdas", type=float, nargs="+", default=[0.1, 0.25, 0.5])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.02, 0.05, 0.1])
    parser.add_argument("--tap", type=int, default=-1, help="which tapped layer keys the store (-1: last)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    users = load_bench_users(
        args.data, dev_split=True, max_queries=args.max_queries, max_users=args.max_users
    )
    personalizer = Personalizer.open(bundle=args.bundle, n_threads=args.threads)
    personalizer.engine.set_adapter("global")
    study = Study(personalizer, args.tap)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.mode == "likelihood":
        likelihood_pass(study, users, args)
    else:
        decode_pass(study, users, args)


if __name__ == "__main__":
    main()
