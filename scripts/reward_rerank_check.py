"""Diagnostic: does the CARD reward prefer the better of several finished headlines?

For each query of a finished `localpers bench` run, takes the headlines that several methods produced,
scores each with the author's reward `R = lambda . g(y)` (teacher-forced through the cluster adapter),
and reports the ROUGE-1 of the highest-rewarded one, next to each method's own mean and the oracle.
lambda is either the cluster's default vector or a vector fitted towards zero on the author's pairs
(features cached by `scripts/card_experiments.py`). It neither generates nor changes anything.

    python scripts/reward_rerank_check.py --data ../shared/data/news-headlines/test.jsonl \
        --features ../exp/card/features --run global=../bench-runs/demo/cache/global \
        --run rag=../bench-runs/demo/cache/rag --run cluster=../bench-runs/demo/cache/cluster \
        --run card=../bench-runs/demo/cache/card@prior=1.0 --run cope=../bench-runs/h20/cache/cope
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from localpers.bench.data import load_bench_users
from localpers.methods.card.fitting import fit_vector
from localpers.methods.card.personalizer import Personalizer
from localpers.tasks import get_task


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--features", type=Path, required=True, help="card_experiments.py's features folder")
    ap.add_argument("--run", action="append", required=True, help="NAME=bench cache folder of one method")
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    runs = dict(item.split("=", 1) for item in args.run)
    p = Personalizer.open(bundle=args.bundle, n_threads=args.threads)
    rows = []
    for user in load_bench_users(args.data):
        cached = dict(np.load(args.features / f"{user.store_name}.npz"))
        meta = json.loads((args.features / f"{user.store_name}.json").read_text())
        keep = ~np.asarray(meta["identical"])
        differences = (cached["g_plus"] - cached["g_minus"])[keep]
        cluster = int(meta["cluster"])
        vectors = {
            "cluster default": p.head.default_vector(cluster),
            "fitted towards 0": fit_vector(differences, np.zeros(p.head.d, np.float32), 1.0),
        }
        records = {
            name: json.loads((Path(folder) / f"{user.store_name}.json").read_text())
            for name, folder in runs.items()
        }
        p.engine.set_adapter(p.bundle.cluster_adapter_name(cluster))
        for index, query in enumerate(user.queries):
            names = list(runs)
            texts = [records[n]["queries"][index]["text"] or "." for n in names]
            prompt = p.engine.tokenize(get_task("headline").prompt_for(query.input))
            scored = p.engine.score(prompt, [p.engine.tokenize(" " + t, add_bos=False) for t in texts])
            g = np.stack([p.head.sequence_feature(s.tokens, s.features) for s in scored])
            lengths = np.array([len(s.tokens) for s in scored])
            row = {"rouge1": [records[n]["queries"][index]["rouge1"] for n in names], "names": names}
            row["mean_logprob"] = [float(s.logprobs.sum()) / len(s.tokens) for s in scored]
            for label, vector in vectors.items():
                row[label] = (g @ vector).tolist()
                row[label + " per token"] = ((g @ vector) / lengths).tolist()
            rows.append(row)
        print(user.store_name, file=sys.stderr)
    p.close()
    r1 = np.array([r["rouge1"] for r in rows])
    report = {
        "n": len(rows),
        "methods": dict(zip(rows[0]["names"], r1.mean(axis=0).round(4).tolist(), strict=True)),
    }
    for key in [k for k in rows[0] if k not in ("rouge1", "names")]:
        picks = [r["rouge1"][int(np.argmax(r[key]))] for r in rows]
        report[f"highest {key}"] = round(float(np.mean(picks)), 4)
    report["oracle"] = round(float(r1.max(axis=1).mean()), 4)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
