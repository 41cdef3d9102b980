"""RESULTS.md's headline table and per-author plot, from the caches of one `localpers bench` run.

Each row is METHOD or METHOD:PAIRED (PAIRED = the method it is also compared with, e.g. the cluster adapter at
the same history size). Columns: mean ROUGE-1; the ratio to the global adapter with paired bootstrap 95%
intervals over queries and over authors; authors improved; the difference to PAIRED (query interval); the
gold-likelihood difference to global (mean log p per token of the author's real headline; query interval).
`--plot` draws each listed method's per-author ROUGE-1 ratio to global (one PNG); an author on whose queries
global scored 0 has no ratio, so no bar (the figure and a printed note name them).

Usage:
    python scripts/headline_table.py ../bench-runs/test7 cluster@history=20 card-auto@history=20:cluster@history=20 \
        --plot docs/img/authors.png --plot-methods cluster@history=20,card-auto@history=20
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from compare_runs import compare, load


def _gold_difference(
    reference: dict, other: dict, resamples: int, seed: int
) -> tuple[float, list[float]] | None:
    pairs = [
        (reference[u][q].get("gold_logprob"), other[u][q].get("gold_logprob"))
        for u in sorted(set(reference) & set(other))
        for q in sorted(set(reference[u]) & set(other[u]))
    ]
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
    if not pairs:
        return None
    diff = np.array([b - a for a, b in pairs])
    picks = np.random.default_rng(seed).integers(0, len(diff), size=(resamples, len(diff)))
    low, high = np.percentile(diff[picks].mean(1), [2.5, 97.5])
    return float(diff.mean()), [float(low), float(high)]


def _interval(values: list[float], digits: int = 3, signed: bool = False) -> str:
    """ "[low, high]"; `signed` for a difference, so that its bounds read like its "+0.0012" mean."""
    sign = "+" if signed else ""
    return f"[{values[0]:{sign}.{digits}f}, {values[1]:{sign}.{digits}f}]"


def table(run: str, rows: list[str], reference: str, resamples: int, seed: int) -> str:
    base = load(f"{run}:{reference}")
    lines = [
        "| method | R-1 | / global [query CI] | author CI | authors improved | Δ R-1 vs paired [query CI] |"
        " Δ gold vs global [CI] |",
        "|---|---:|---|---|---:|---|---|",
        f"| {reference} | {np.mean([q['rouge1'] for u in base.values() for q in u.values()]):.4f} | 1 | | | | |",
    ]
    for row in rows:
        method, _, paired = row.partition(":")
        other = load(f"{run}:{method}")
        versus = compare(base, other, resamples, seed, names=(f"{run}:{reference}", f"{run}:{method}"))
        gold = _gold_difference(base, other, resamples, seed)
        gold_text = "" if gold is None else f"{gold[0]:+.3f} {_interval(gold[1], signed=True)}"
        paired_text = ""
        if paired:
            names = (f"{run}:{paired}", f"{run}:{method}")
            against = compare(load(f"{run}:{paired}"), other, resamples, seed, names=names)
            paired_text = (
                f"{against['diff']:+.4f} {_interval(against['diff_query_ci'], 4, signed=True)} ({paired})"
            )
        lines.append(
            f"| {method} | {versus['rouge1']:.4f} | {versus['ratio']:.3f} {_interval(versus['ratio_query_ci'])} |"
            f" {_interval(versus['ratio_author_ci'])} | {versus['authors_improved']} | {paired_text} | {gold_text} |"
        )
    return "\n".join(lines)


def plot_authors(run: str, methods: list[str], reference: str, path: Path) -> list[str]:
    """Draw each method's per-author ROUGE-1 ratio to `reference`; returns the authors without a ratio (the
    reference scored 0 on all their queries), whose bars are left out and named in the figure."""
    from localpers.plotting import pyplot

    plt = pyplot()
    base = load(f"{run}:{reference}")
    authors = sorted(base)
    scored_zero = [a for a in authors if np.mean([base[a][q]["rouge1"] for q in base[a]]) == 0]
    figure, axis = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(methods)
    for index, method in enumerate(methods):
        other = load(f"{run}:{method}")
        _check_covers(base, other, run, method, reference)
        ratios = [_ratio(base[a], other[a]) for a in authors]
        positions = np.arange(len(authors)) + (index - (len(methods) - 1) / 2) * width
        axis.bar(positions, ratios, width, label=method)
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_xticks(np.arange(len(authors)), authors, rotation=60, fontsize=8)
    axis.set_ylabel(f"ROUGE-1 / {reference}")
    axis.set_title(f"Per-author ROUGE-1 ratio to {reference} ({Path(run).name})")
    if scored_zero:
        note = f"no ratio ({reference} scored 0): {', '.join(scored_zero)}"
        axis.text(0.01, 0.98, note, transform=axis.transAxes, va="top", fontsize=7)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return scored_zero


def _ratio(reference: dict, other: dict) -> float:
    """An author's mean ROUGE-1 over the reference's; NaN (no bar) where the reference scored 0."""
    base = np.mean([reference[q]["rouge1"] for q in reference])
    return float(np.mean([other[q]["rouge1"] for q in reference]) / base) if base > 0 else float("nan")


def _check_covers(base: dict, other: dict, run: str, method: str, reference: str) -> None:
    """Refuse, in one line, a method that lacks an author or query of the reference's."""
    missing = sorted(a for a in base if a not in other or not set(base[a]) <= set(other[a]))
    if missing:
        raise SystemExit(
            f"{run}/cache/{method} lacks queries of {len(missing)} of {reference}'s authors"
            f" ({', '.join(missing[:5])}): rerun the bench with -m {method} --out {run}, or plot other methods"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a bench --out folder")
    parser.add_argument("rows", nargs="+", help="METHOD or METHOD:PAIRED")
    parser.add_argument("--reference", default="global")
    parser.add_argument("--resamples", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--plot-methods", default="")
    args = parser.parse_args()
    print(table(args.run, args.rows, args.reference, args.resamples, args.seed))
    if args.plot:
        methods = [m for m in args.plot_methods.split(",") if m] or [r.partition(":")[0] for r in args.rows]
        scored_zero = plot_authors(args.run, methods, args.reference, args.plot)
        print(f"plot {args.plot}")
        if scored_zero:
            print(
                f"note: no ratio for {len(scored_zero)} authors whose {args.reference} scored 0 (bars left out):"
                f" {', '.join(scored_zero)}"
            )


if __name__ == "__main__":
    main()
