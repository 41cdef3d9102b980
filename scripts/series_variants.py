"""Dev-split study of the series rule's settings (RESULTS 0zn): how alike, how many shown, how deep to look.

The device's prompt shows a series the user repeats by its latest members (`localpers.users.series`). This
script decodes, with the conditioned global adapter exactly as `localpers bench`'s `global-history` does
(`Personalizer.rewrite`, greedy with the word rule), only the queries whose prompt a variant changes, and pairs
them with a bench run's `global-history` outputs of the same queries without the rule (the other queries' outputs
cannot change). A variant is `MIN_SIZE,SHOWN,DEPTH`: the fewest alike headlines that make a series, how many of
its members the prompt shows, and among how many of the BM25-closest items a series is looked for; the product's
is 3,3,10. It prints, per variant, the queries and authors it fires on, both mean ROUGE-1s there, and the change
over all of the run's queries with its paired interval (the others unchanged). It sets the
module constants of `localpers.users.history_prompt` for each variant: a study, not a product path.

    python scripts/series_variants.py --bundle ../bundle-a --run ../bench-runs/dev47-a \
        --variants 3,3,10 3,2,10 3,3,1 2,3,10
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from series_queries import headline_index, output_key, outputs

from localpers.bench.data import load_bench_users
from localpers.bench.metrics import paired_bootstrap, rouge
from localpers.methods.card.personalizer import Personalizer
from localpers.users import history_prompt
from localpers.users.history_prompt import PromptFormat

WITHOUT = PromptFormat(examples=5, recent=4)


def set_variant(min_size: int, shown: int, depth: int) -> PromptFormat:
    """Point the composition at one variant's settings; the format that turns the rule on."""
    history_prompt.SERIES_SHOWN = shown
    history_prompt.SERIES_SEARCH_DEPTH = depth
    return PromptFormat(examples=5, recent=4, series=min_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/news-headlines/train.jsonl"))
    parser.add_argument("--bundle", required=True)
    parser.add_argument(
        "--run", type=Path, required=True, help="a `localpers bench --dev-split` run without the rule"
    )
    parser.add_argument("--variants", nargs="+", default=["3,3,10"])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    users = load_bench_users(args.data, dev_split=True)
    before = {key: score for key, (score, _) in outputs(f"{args.run}:global-history").items()}
    personalizer = Personalizer.open(bundle=args.bundle, n_threads=args.threads)
    for spec in args.variants:
        min_size, shown, depth = (int(part) for part in spec.split(","))
        with_rule = set_variant(min_size, shown, depth)
        pairs, authors, after = [], set(), dict(before)
        for user in users:
            index = headline_index(user)
            if not index.pool:
                continue
            for query in user.queries:
                prompt = index.prompt_for(query.input, with_rule)
                if prompt == index.prompt_for(query.input, WITHOUT):
                    continue
                key = output_key(user, query)
                if key not in before:
                    raise SystemExit(
                        f"{args.run}/outputs.jsonl has no global-history output for user {user.user_id} query"
                        f" {query.id}: give a whole `localpers bench --dev-split` run of {args.data}"
                    )
                result = personalizer.rewrite(
                    query.input, method="global-history", history=index, prompt_format=with_rule
                )
                after[key] = rouge(result.text, query.reference).rouge1
                pairs.append((before[key], after[key]))
                authors.add(user.user_id)
        if not pairs:
            print(f"{spec}: fires on no query")
            continue
        without, with_series = np.array(pairs).T
        keys = sorted(before)
        overall = paired_bootstrap([after[k] for k in keys], [before[k] for k in keys])
        print(
            f"{spec}: {len(pairs)} queries ({len(authors)} authors), R-1 without {without.mean():.4f},"
            f" with the series {with_series.mean():.4f}; over all {len(keys)} queries {overall.mean:+.4f}"
            f" [{overall.low:+.4f}, {overall.high:+.4f}]",
            flush=True,
        )


if __name__ == "__main__":
    main()
