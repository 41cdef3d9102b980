"""PNG figures of a results.json: bars with intervals, per-author gains, gains by sibling score, the
low-resource curve, sweeps.

Each function takes the results object, writes one PNG (matplotlib, Agg backend, no display) and
returns its path, or None when the run holds no methods for that figure (e.g. no `@history=` runs
means no low-resource curve). Each PNG is rendered in memory and written atomically (`save_figure`): a
full disk leaves no empty or half-written file, and the error names the file. `PLOT_NAMES` lists every
figure a run may make. This module reads nothing but the results object.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

from localpers.atomic import atomic_write_bytes
from localpers.plotting import pyplot

HISTORY_ALL_LABEL = "all"
PLOT_NAMES = (
    "bars.png",
    "authors.png",
    "siblings.png",
    "gold.png",
    "low_resource.png",
    "alpha_sweep.png",
    "topk_sweep.png",
)


def main_methods(results: dict[str, Any]) -> list[str]:
    """Methods run without parameters (global, rag, cluster, card, ...), in run order."""
    return [name for name, row in results["methods"].items() if not row.get("overrides")]


def history_curves(results: dict[str, Any]) -> dict[str, list[tuple[int | None, str]]]:
    """base method -> [(history limit or None for all, method name)] for methods varying only `history`."""
    curves: dict[str, list[tuple[int | None, str]]] = {}
    for name, row in results["methods"].items():
        if row["base"] == "global" or set(row.get("overrides", {})) - {"history"}:
            continue
        if "history" not in row["params"]:
            continue
        curves.setdefault(row["base"], []).append((row["params"]["history"], name))
    limited = {
        base: points
        for base, points in curves.items()
        if len(points) >= 2 and any(h is not None for h, _ in points)
    }
    for points in limited.values():
        points.sort(key=lambda p: math.inf if p[0] is None else p[0])
    return limited


def sweep_points(results: dict[str, Any], param: str, base: str = "card") -> list[tuple[float, str]]:
    """[(value of `param`, method name)] for `base` methods that vary only `param`, sorted by value."""
    points = []
    for name, row in results["methods"].items():
        if row["base"] == base and set(row.get("overrides", {})) <= {param} and param in row["params"]:
            points.append((float(row["params"][param]), name))
    return sorted(points) if len(points) >= 2 else []


def plot_bars(results: dict[str, Any], path: Path) -> Path | None:
    names = main_methods(results)
    if not names:
        return None
    plt = pyplot()
    rows = results["methods"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    means = [rows[n]["rouge1"] for n in names]
    lows = [rows[n]["rouge1"] - rows[n]["rouge1_ci"][0] for n in names]
    highs = [rows[n]["rouge1_ci"][2] - rows[n]["rouge1"] for n in names]
    left.bar(names, means, yerr=[lows, highs], capsize=4, color="#4c72b0")
    left.set_ylabel("ROUGE-1 (mean over queries)")
    left.set_title("ROUGE-1 with 95% bootstrap interval")
    _difference_panel(right, results, names, "rouge1", "ROUGE-1 difference to global")
    return _save(fig, (left, right), path)


def _difference_panel(axis: Any, results: dict[str, Any], names: list[str], metric: str, label: str) -> None:
    """Bars of each method's paired difference to global in `metric`, green/red where the interval excludes 0."""
    deltas = results.get("deltas_vs_global", {})
    others = [n for n in names if (deltas.get(n) or {}).get(metric)]
    if others:
        intervals = [deltas[n][metric] for n in others]
        axis.bar(
            others,
            [iv[1] for iv in intervals],
            yerr=[[iv[1] - iv[0] for iv in intervals], [iv[2] - iv[1] for iv in intervals]],
            capsize=4,
            color=["#55a868" if iv[0] > 0 else "#c44e52" if iv[2] < 0 else "#8c8c8c" for iv in intervals],
        )
        axis.axhline(0, color="black", linewidth=0.8)
    axis.set_ylabel(label)
    axis.set_title("Paired difference to global, 95% interval")


def save_figure(fig: Any, path: Path, dpi: int = 120) -> Path:
    """`fig` as a PNG at `path`, written atomically, and closed."""
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=dpi)
    finally:
        pyplot().close(fig)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def _save(fig: Any, axes: tuple[Any, ...], path: Path, rotation: int = 20) -> Path:
    for axis in axes:
        axis.tick_params(axis="x", rotation=rotation)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_low_resource(results: dict[str, Any], path: Path) -> Path | None:
    curves = history_curves(results)
    if not curves:
        return None
    plt = pyplot()
    rows = results["methods"]
    labels = sorted(
        {h for points in curves.values() for h, _ in points}, key=lambda h: math.inf if h is None else h
    )
    position = {h: i for i, h in enumerate(labels)}
    fig, axis = plt.subplots(figsize=(7, 4))
    for index, (base, points) in enumerate(curves.items()):
        offset = 0.06 * (index - (len(curves) - 1) / 2)  # keep the interval bars apart
        xs = [position[h] + offset for h, _ in points]
        ys = [rows[name]["rouge1"] for _, name in points]
        errors = [
            [rows[name]["rouge1"] - rows[name]["rouge1_ci"][0] for _, name in points],
            [rows[name]["rouge1_ci"][2] - rows[name]["rouge1"] for _, name in points],
        ]
        axis.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=base)
    if "global" in rows:
        axis.axhline(rows["global"]["rouge1"], color="black", linestyle="--", linewidth=1, label="global")
    axis.set_xticks(range(len(labels)), [HISTORY_ALL_LABEL if h is None else str(h) for h in labels])
    axis.set_xlabel("history items used (most recent)")
    axis.set_ylabel("ROUGE-1")
    axis.set_title("Low-resource curve (95% bootstrap interval of the mean)")
    axis.legend(loc="best")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_sweep(results: dict[str, Any], param: str, path: Path, *, label: str) -> Path | None:
    points = sweep_points(results, param)
    if not points:
        return None
    plt = pyplot()
    rows = results["methods"]
    xs = [x for x, _ in points]
    ys = [rows[name]["rouge1"] for _, name in points]
    errors = [
        [rows[name]["rouge1"] - rows[name]["rouge1_ci"][0] for _, name in points],
        [rows[name]["rouge1_ci"][2] - rows[name]["rouge1"] for _, name in points],
    ]
    fig, axis = plt.subplots(figsize=(7, 4))
    axis.errorbar(xs, ys, yerr=errors, marker="o", capsize=4, label="card")
    for reference, style in (("global", "--"), ("cluster", ":")):
        if reference in rows:
            axis.axhline(
                rows[reference]["rouge1"], color="black", linestyle=style, linewidth=1, label=reference
            )
    axis.set_xlabel(label)
    axis.set_ylabel("ROUGE-1")
    axis.set_title(f"CARD: ROUGE-1 against {label} (95% bootstrap interval)")
    axis.legend()
    fig.tight_layout()
    return save_figure(fig, path)


def plot_gold(results: dict[str, Any], path: Path) -> Path | None:
    """Gold likelihood per method (every method that has it) and its paired difference to global."""
    rows = results["methods"]
    names = [
        n for n, row in rows.items() if row.get("gold_logprob") is not None and row.get("gold_logprob_ci")
    ]
    if not names:
        return None
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    means = [rows[n]["gold_logprob"] for n in names]
    lows = [rows[n]["gold_logprob"] - rows[n]["gold_logprob_ci"][0] for n in names]
    highs = [rows[n]["gold_logprob_ci"][2] - rows[n]["gold_logprob"] for n in names]
    left.errorbar(names, means, yerr=[lows, highs], fmt="o", capsize=4, color="#4c72b0")
    left.set_ylabel("log p per token of the author's headline")
    left.set_title("Gold likelihood, 95% bootstrap interval")
    _difference_panel(right, results, names, "gold_logprob", "difference to global (nats/token)")
    return _save(fig, (left, right), path)


def plot_authors(results: dict[str, Any], path: Path) -> Path | None:
    """Each main method's ROUGE-1 gain over global per author (mean over the author's queries), authors in
    the order of the first method's gain; the legend says how many authors each method improves."""
    users = results.get("users") or {}
    names = [n for n in main_methods(results) if n != "global"]
    gains = {
        name: {
            user: row["rouge1"][name] - row["rouge1"]["global"]
            for user, row in users.items()
            if name in row.get("rouge1", {}) and "global" in row.get("rouge1", {})
        }
        for name in names
    }
    gains = {name: table for name, table in gains.items() if table}
    if not gains:
        return None
    plt = pyplot()
    first = next(iter(gains.values()))
    authors = sorted(first, key=lambda user: first[user])
    fig, axis = plt.subplots(figsize=(max(6.0, 0.35 * len(authors) + 2), 4))
    width = 0.8 / len(gains)
    for offset, (name, table) in enumerate(gains.items()):
        positions = [i + (offset - (len(gains) - 1) / 2) * width for i in range(len(authors))]
        counted = (results.get("authors_vs_global") or {}).get(name)
        label = f"{name} ({counted['improved']}/{counted['authors']} improved)" if counted else name
        axis.bar(positions, [table.get(user, 0.0) for user in authors], width, label=label)
    axis.axhline(0.0, color="black", linewidth=0.8)
    # an author id is any text: "$...$" in it was read as math, and a bad formula crashed the whole run's plotting
    axis.set_xticks(
        range(len(authors)), [user.replace("$", r"\$") for user in authors], ha="right", fontsize=7
    )
    axis.set_ylabel("ROUGE-1 minus global's (author's mean)")
    axis.set_title("Per-author ROUGE-1 gain over global")
    axis.legend(fontsize=8)
    return _save(fig, (axis,), path, rotation=60)


def plot_siblings(results: dict[str, Any], path: Path) -> Path | None:
    """Each main method's paired ROUGE-1 difference to global per sibling-score bin, with its 95% interval;
    each bin's label says how many queries it holds."""
    entry = results.get("by_sibling") or {}
    names = [n for n in main_methods(results) if n in entry.get("methods", {})]
    bins = [b for b in entry.get("bins", []) if b["queries"]]
    if not names or not bins:
        return None
    plt = pyplot()
    fig, axis = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(names)
    for offset, name in enumerate(names):
        cells = {
            cell["bin"]: cell for cell in entry["methods"][name]["bins"] if cell["n"] and cell.get("delta")
        }
        shown = [(i, cells[b["name"]]) for i, b in enumerate(bins) if b["name"] in cells]
        positions = [i + (offset - (len(names) - 1) / 2) * width for i, _ in shown]
        deltas = [cell["delta"] for _, cell in shown]
        axis.bar(
            positions,
            [d[1] for d in deltas],
            width,
            yerr=[[d[1] - d[0] for d in deltas], [d[2] - d[1] for d in deltas]],
            capsize=3,
            label=name,
        )
    axis.axhline(0.0, color="black", linewidth=0.8)
    labels = [f"{b['name']}\n{b['queries']} queries, {b['authors']} authors" for b in bins]
    axis.set_xticks(range(len(bins)), labels, fontsize=8)
    axis.set_xlabel("best R-1 of an earlier headline of the author against the answer (sibling score)")
    axis.set_ylabel("ROUGE-1 minus global's")
    axis.set_title("Where the gain comes from (paired 95% interval)")
    axis.legend(fontsize=8)
    return _save(fig, (axis,), path, rotation=0)


def write_plots(results: dict[str, Any], directory: Path) -> list[Path]:
    """Every figure the results support, as PNGs in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    bars, authors, siblings, gold, low_resource, alpha_sweep, topk_sweep = (directory / n for n in PLOT_NAMES)
    written = [
        plot_bars(results, bars),
        plot_authors(results, authors),
        plot_siblings(results, siblings),
        plot_gold(results, gold),
        plot_low_resource(results, low_resource),
        plot_sweep(results, "strength", alpha_sweep, label="strength α"),
        plot_sweep(results, "top_k", topk_sweep, label="top-k"),
    ]
    return [path for path in written if path is not None]
