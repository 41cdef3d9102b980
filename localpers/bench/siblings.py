"""Where a run's gain comes from: its queries binned by how close the author's history came to the answer.

A query's *sibling score* is the highest ROUGE-1 of any of the author's history headlines (the history the
run gave its methods, `--history-limit` applied) against the author's real headline for the query. It is a
property of the data, chosen with the answer, that no method sees: high where the author writes to a formula
(a weekly series), middling where an earlier headline shares the subject, low elsewhere. On the shared test
file 8 of 302 queries reach 0.5 and carry most of the personalized methods' gain (docs/RESULTS.md, 0zm), so
a ratio over all queries says as much about how formulaic the authors are as about the method.

`gain_by_sibling` reports, per method against the baseline and per bin, the queries, both mean ROUGE-1s,
their ratio and the paired interval of the difference, and the share of the top bin at which the method's
ratio would reach a target with the other bins' proportions and every bin's means held. This module reads
the bench's users and records; it generates, plots and writes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from localpers.bench.data import BenchUser
from localpers.bench.metrics import paired_bootstrap, rouge

EDGES = (0.3, 0.5)
DIGITS = 5


def sibling_score(history_outputs: Sequence[str], reference: str) -> float:
    """The best ROUGE-1 of an earlier output against `reference` (0.0 without history)."""
    return max((rouge(output, reference).rouge1 for output in history_outputs), default=0.0)


def bin_names(edges: Sequence[float] = EDGES) -> list[str]:
    """["< 0.3", "0.3-0.5", ">= 0.5"] for the default edges."""
    middle = [f"{low}-{high}" for low, high in zip(edges, edges[1:], strict=False)]
    return [f"< {edges[0]}", *middle, f">= {edges[-1]}"]


def bin_index(score: float, edges: Sequence[float] = EDGES) -> int:
    """The bin of a sibling score: 0 below the first edge, len(edges) at or above the last."""
    return int(np.searchsorted(np.asarray(edges), score, side="right"))


def query_bins(
    users: Sequence[BenchUser], history_limit: int | None, edges: Sequence[float] = EDGES
) -> dict[tuple[str, str], int]:
    """{(user id, query id): bin} for every query of `users`."""
    bins: dict[tuple[str, str], int] = {}
    for user in users:
        outputs = [item.output for item in user.history_up_to(history_limit)]
        for query in user.queries:
            bins[(user.user_id, query.id)] = bin_index(sibling_score(outputs, query.reference), edges)
    return bins


def share_needed(
    baseline_means: np.ndarray, method_means: np.ndarray, shares: np.ndarray, target: float
) -> float | None:
    """The top bin's share at which sum(share * method) / sum(share * baseline) reaches `target`.

    The other bins keep their proportions among themselves; None when no share in [0, 1] reaches it.
    """
    rest = shares[:-1] / shares[:-1].sum() if shares[:-1].sum() > 0 else shares[:-1]
    rest_method, rest_baseline = float(rest @ method_means[:-1]), float(rest @ baseline_means[:-1])
    # target * ((1 - s) rest_baseline + s baseline_top) = (1 - s) rest_method + s method_top, for s
    slope = (method_means[-1] - rest_method) - target * (baseline_means[-1] - rest_baseline)
    if slope == 0:
        return None
    share = (target * rest_baseline - rest_method) / slope
    return float(share) if 0.0 <= share <= 1.0 else None


def sibling_summary(entry: dict[str, Any], method: str) -> str | None:
    """One line for the printed summary: the top bin's share and `method`'s ratio in each bin with queries."""
    row = entry.get("methods", {}).get(method)
    if row is None:
        return None
    bins = entry["bins"]
    total = sum(b["queries"] for b in bins)
    baseline = entry.get("baseline", "global")
    cells = [cell for cell in row["bins"] if cell["n"] and cell.get("ratio") is not None]
    ratios = (
        ", ".join(f"{cell['ratio']:.3f}x at {cell['bin']}" for cell in cells)
        or f"undefined ({baseline} scored 0)"
    )
    share = bins[-1]["queries"] / total if total else 0.0
    return f"{share:.1%} of the queries have a sibling {bins[-1]['name']}; {method} / {baseline}: {ratios}"


def _scores(records: Sequence[dict[str, Any]]) -> dict[tuple[str, str], float]:
    return {(str(r["user_id"]), q["query_id"]): float(q["rouge1"]) for r in records for q in r["queries"]}


def gain_by_sibling(
    users: Sequence[BenchUser],
    records: dict[str, list[dict[str, Any]]],
    baseline: str,
    *,
    history_limit: int | None,
    target: float,
    edges: Sequence[float] = EDGES,
    n_resamples: int,
    seed: int,
    other_windows: dict[str, int | None] | None = None,
) -> dict[str, Any]:
    """The results.json entry: the bins (queries, authors) and, per method, each bin's figures.

    The bins are by the history the run's `history_limit` keeps; a method fitted on another window of it
    (`other_windows`: its name and limit, `card@history=1`) never saw those siblings, so it is left out of the
    bins and named under `left_out`. The bins count the queries the baseline scored: all of `users`' in a bench
    run, fewer where a run's outputs are read against a whole file (a run made with --max-queries)."""
    baseline_scores = _scores(records[baseline])
    bins = {key: b for key, b in query_bins(users, history_limit, edges).items() if key in baseline_scores}
    names = bin_names(edges)
    counts = np.bincount(list(bins.values()), minlength=len(names)) if bins else np.zeros(len(names))
    shares = counts / max(1, counts.sum())
    entry: dict[str, Any] = {
        "baseline": baseline,
        "edges": list(edges),
        "history_limit": history_limit,
        "bins": [
            {
                "name": name,
                "queries": int(counts[index]),
                "authors": len({user for (user, _), b in bins.items() if b == index}),
            }
            for index, name in enumerate(names)
        ],
        "methods": {},
        "left_out": {
            name: f"fitted on {'all' if limit is None else limit} history item(s), not the run's window"
            for name, limit in (other_windows or {}).items()
        },
    }
    for method, method_records in records.items():
        if method == baseline or method in (other_windows or {}):
            continue
        scores = _scores(method_records)
        rows = []
        baseline_means, method_means = np.zeros(len(names)), np.zeros(len(names))
        for index, name in enumerate(names):
            keys = [key for key, b in bins.items() if b == index and key in scores and key in baseline_scores]
            if not keys:
                rows.append({"bin": name, "n": 0})
                continue
            a = [scores[key] for key in keys]
            b = [baseline_scores[key] for key in keys]
            baseline_means[index], method_means[index] = np.mean(b), np.mean(a)
            delta = paired_bootstrap(a, b, n_resamples=n_resamples, seed=seed)
            rows.append(
                {
                    "bin": name,
                    "n": len(keys),
                    "rouge1": round(float(np.mean(a)), DIGITS),
                    "baseline_rouge1": round(float(np.mean(b)), DIGITS),
                    "ratio": round(float(np.mean(a) / np.mean(b)), DIGITS) if np.mean(b) > 0 else None,
                    "delta": delta.as_list(DIGITS),  # None for a bin of one query
                }
            )
        needed = share_needed(baseline_means, method_means, shares, target) if counts[-1] else None
        entry["methods"][method] = {
            "bins": rows,
            "top_share_for_target": None if needed is None else round(needed, 4),
        }
    entry["target"] = target
    return entry
