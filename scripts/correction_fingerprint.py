"""Fingerprint CARD's correction: for a change meant to be exact, the same file before and after, byte for byte.

For each --users user (fitted: cluster, vector, token bias) and each of four settings (default strength with the
bias at 0.1, 1 and 2; the bias alone at 2), rewrites the first --articles test queries with CARD's correction and
scores each query's reference teacher-forced. After every step of the correction, the candidate ids and logits it
leaves are hashed; the file holds, per rewrite, the text, the gold log-probability and that hash. Two runs of the
same code on one machine give the same file; compare with `cmp` (docs/PERFORMANCE.md, sixty-fifth session).

Usage: LOCALPERS_HOME=/tmp/h python scripts/correction_fingerprint.py --data ../shared/data/news-headlines/test.jsonl
       --out /tmp/before.json [--users u003 u015 u026 demo] [--articles 6] [--threads 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

from localpers.bench.data import load_bench_users
from localpers.engine.decoding import Candidates
from localpers.methods.card.correction import CardCorrection
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.card.user_state import stored_token_bias, user_profile
from localpers.tasks import get_task
from localpers.users.store import UserStore

SETTINGS = [(None, 0.1), (None, 1.0), (0.0, 2.0), (None, 2.0)]  # (vector strength, bias strength)


class StepHash:
    """Hashes what every `CardCorrection.apply` leaves in the candidates."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()
        original = CardCorrection.apply

        def apply(correction: CardCorrection, candidates: Candidates, features: Any) -> None:
            original(correction, candidates, features)
            self.digest.update(candidates.ids.tobytes())
            self.digest.update(candidates.logits.tobytes())

        CardCorrection.apply = apply  # type: ignore[method-assign]

    def take(self) -> str:
        """The hash since the last call, and start a new one."""
        value, self.digest = self.digest.hexdigest(), hashlib.sha256()
        return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--users", nargs="+", default=["u003", "u015", "u026", "demo"])
    parser.add_argument("--articles", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    steps = StepHash()
    queries = [q for user in load_bench_users(args.data) for q in user.queries][: args.articles]
    personalizer = Personalizer.open(n_threads=args.threads)
    store = UserStore()
    task = get_task("headline")
    record: dict[str, list[Any]] = {}
    for name in args.users:
        user = store.get(name)
        cluster, vector, state = user_profile(user)
        bias = stored_token_bias(user, state)
        history = user.history_index(task)
        for strength, bias_strength in SETTINGS:
            for number, query in enumerate(queries):
                steps.take()
                result = personalizer.rewrite(
                    query.input,
                    method="card",
                    cluster=cluster,
                    vector=vector,
                    strength=strength,
                    bias=bias,
                    bias_strength=bias_strength,
                    history=history,
                    reference=query.reference,
                )
                key = f"{name}/{strength}/{bias_strength}/{number}"
                record[key] = [result.text, result.gold_logprob, steps.take()]
    args.out.write_text(json.dumps(record, indent=0) + "\n", encoding="utf-8")
    print(f"{len(record)} rewrites fingerprinted in {args.out}")


if __name__ == "__main__":
    main()
