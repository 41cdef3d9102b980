"""Time EXACT's attribute search one candidate at a time (the old path) against side by side (the new one).

Runs `index_exact` on the demo user's history with the real demo bundle (models/demo-bundle) and the embedded
Gemma 3 270M backbone, in one process on one engine, alternating the two paths `--rounds` times; each run
searches the same `--pairs` most recent pairs from scratch (the selection cache is deleted before it). The old
path is `index_exact` with `PrefixScorer` in place of `SideBySideScorer`: its `score_each` scores the candidates
one at a time exactly as the one-margin-at-a-time search did. Prints seconds per pair for each run, the median
ratio new/old, and how often the two paths chose the same attributes (they differ by llama.cpp's batch-split
noise: docs/PERFORMANCE.md, eighty-ninth session). Nothing is downloaded; everything is written under --home.

    LOCALPERS_HOME=$(mktemp -d) python scripts/time_exact_search.py --pairs 2 --rounds 2 --threads 2 [--control]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=3, help="pairs searched per run (the most recent items)")
    parser.add_argument("--rounds", type=int, default=1, help="old/new runs, alternating")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: the engine's)")
    parser.add_argument(
        "--control",
        action="store_true",
        help="also run the old path once with the library in reverse order (another reuse pattern, so other"
        " batch-split noise): how often the old path agrees with itself",
    )
    args = parser.parse_args()
    if not os.environ.get("LOCALPERS_HOME"):
        sys.exit("set LOCALPERS_HOME to a scratch folder first")

    from localpers.bundle.format import open_bundle
    from localpers.engine.backbone import Backbone, cached_sha256, default_backbone_path
    from localpers.methods import exact, exact_cache
    from localpers.methods.attributes import ATTRIBUTES
    from localpers.methods.card.personalizer import Personalizer
    from localpers.methods.scoring import PrefixScorer
    from localpers.methods.scoring_batch import SideBySideScorer
    from localpers.users.history import HistoryItem
    from localpers.users.store import UserStore

    path = default_backbone_path()
    backbone = Backbone(path=path, sha256=cached_sha256(path), source="default")
    bundle = open_bundle(REPO / "models" / "demo-bundle", backbone_sha256=backbone.sha256)
    personalizer = Personalizer(bundle, backbone, n_threads=args.threads)
    store = UserStore()
    user = store.get("timing") if "timing" in store.list() else store.create("timing")
    if not user.history():
        rows = [json.loads(line) for line in (REPO / "models" / "demo-user" / "history.jsonl").open()]
        user.save_history([HistoryItem.create(r["task"], r["input"], r["output"]) for r in rows])

    def run(
        scorer_class: type, library: tuple[str, ...] = ATTRIBUTES
    ) -> tuple[float, dict[str, tuple[str, ...]], dict[str, float]]:
        (user.dir / exact_cache.SELECTIONS_FILE).unlink(missing_ok=True)
        exact.SideBySideScorer = scorer_class  # type: ignore[attr-defined]
        try:
            report = exact.index_exact(personalizer, user, k=args.k, max_pairs=args.pairs, library=library)
        finally:
            exact.SideBySideScorer = SideBySideScorer  # type: ignore[attr-defined]
        searched = report.n_pairs - report.n_reused
        records = json.loads((user.dir / exact_cache.SELECTIONS_FILE).read_text()).popitem()[1]
        chosen = {item_id: tuple(r["attributes"]) for item_id, r in records.items()}
        margins = {item_id: float(r["margin"]) for item_id, r in records.items()}
        return report.seconds["selection"] / max(searched, 1), chosen, margins

    run(SideBySideScorer)  # warm-up: y- generated and cached, pages loaded; not timed
    times: dict[str, list[float]] = {"old": [], "new": []}
    picks: dict[str, dict[str, tuple[str, ...]]] = {}
    margins: dict[str, dict[str, float]] = {}
    for round_index in range(args.rounds):
        for name, scorer_class in (("old", PrefixScorer), ("new", SideBySideScorer)):
            started = time.perf_counter()
            per_pair, picks[name], margins[name] = run(scorer_class)
            times[name].append(per_pair)
            print(
                f"round {round_index + 1} {name}: {per_pair:.2f} s per pair"
                f" ({time.perf_counter() - started:.1f} s in all, load {os.getloadavg()[0]:.2f})",
                flush=True,
            )
    control = {}
    if args.control:
        _, control, _ = run(PrefixScorer, tuple(reversed(ATTRIBUTES)))

    def agreement(a: dict[str, tuple[str, ...]], b: dict[str, tuple[str, ...]]) -> dict[str, object]:
        return {
            "same_ordered_attributes": f"{sum(a[key] == b.get(key) for key in a)} of {len(a)} pairs",
            "shared_attributes": f"{sum(len(set(a[key]) & set(b[key])) for key in a)} of {args.k * len(a)}",
        }

    ratios = [new / old for old, new in zip(times["old"], times["new"], strict=True)]
    same = sum(picks["old"][key] == picks["new"].get(key) for key in picks["old"])
    gaps = [abs(margins["old"][key] - margins["new"][key]) for key in margins["old"]]
    print(
        json.dumps(
            {
                "cpu_threads": personalizer.engine.n_threads,
                "pairs": args.pairs,
                "k": args.k,
                "old_s_per_pair": [round(t, 2) for t in times["old"]],
                "new_s_per_pair": [round(t, 2) for t in times["new"]],
                "ratio_new_over_old": [round(r, 3) for r in ratios],
                "median_ratio": round(statistics.median(ratios), 3),
                "same_attributes": f"{same} of {len(picks['old'])} pairs",
                "new_vs_old": agreement(picks["old"], picks["new"]),
                "old_vs_old_reversed_library": agreement(picks["old"], control) if control else None,
                "largest_margin_gap_nats": round(max(gaps), 3) if gaps else None,
            },
            indent=1,
        )
    )
    personalizer.close()


if __name__ == "__main__":
    main()
