"""`localpers bench --probes`: does a method learn a style from N history items?

For each style of `bench.styles`, every gold headline of the held-out authors is rewritten in that style;
each method is fitted on the N most recent restyled history items (N = 5, 10, 20 and all by default) and
generates for the first few queries of each author. The hit rate is the share of outputs that carry the
style (the detector's None, "does not apply", is left out of the count), and ROUGE-1 is taken against the
restyled gold so that a method cannot score by emitting the marker alone. The global adapter (sees no
history) is the floor and the few-shot prompt (`rag`: the global adapter with the closest history items as
completed examples) the reference. Each method's ROUGE-1 is also given as a paired difference to the adapter
it corrects, so that "learns the style without losing the words" is a measured statement: to the
conditioned adapter alone (`global-history`) at the same history size where that was run, else to `global`.

Each style is one ordinary benchmark run in `<out>/<style>/` (its cache makes the probes resumable); this
module only drives those runs and aggregates them into probes.json, probes.md and probes.png.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from localpers.atomic import atomic_write_text
from localpers.bench.metrics import mean_interval, paired_bootstrap
from localpers.bench.results import query_scores
from localpers.bench.runner import BenchConfig, Progress, check_output_directory
from localpers.bench.styles import STYLES, get_style

DEFAULT_PROBE_METHODS = ("rag", "cluster")
DEFAULT_HISTORY_SIZES: tuple[int | None, ...] = (5, 10, 20, None)
DEFAULT_QUERIES_PER_USER = 3
DIGITS = 4
ADAPTER_ALONE = "global-history"  # the paired reference of a probe's ROUGE-1, where it was run
FLOOR = "global"


@dataclass
class ProbeConfig:
    """What `localpers bench --probes` runs."""

    data: Path
    out: Path
    styles: list[str] = field(default_factory=lambda: list(STYLES))
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_PROBE_METHODS))
    history_sizes: tuple[int | None, ...] = DEFAULT_HISTORY_SIZES
    max_users: int | None = None
    max_queries: int = DEFAULT_QUERIES_PER_USER
    seed: int = 0
    n_resamples: int = 10_000
    bundle: Path | None = None
    model: str | None = None
    threads: int | None = None
    command: str | None = None
    dev_split: bool = False  # train authors split as the test file (bench.data)


def probe_method_names(methods: list[str], sizes: tuple[int | None, ...]) -> list[str]:
    """Each history-using method once per history size; others (global) once."""
    from localpers.bench.method_names import parse_method
    from localpers.bench.registry import get_method

    names: list[str] = []
    for text in methods:
        spec = parse_method(text)
        if not get_method(spec.base).uses_history or "history" in dict(spec.params):
            names.append(text)
            continue
        joiner = "," if "@" in text else "@"
        names.extend(f"{text}{joiner}history={'all' if size is None else size}" for size in sizes)
    return names


def _label(spec: Any) -> str:
    """The method's name without its history size (which has its own column): `card@bias=2.0`."""
    from localpers.bench.methods import MethodSpec

    return MethodSpec(spec.base, tuple((k, v) for k, v in spec.params if k != "history")).name


def hit_rate(flags: list[bool | None], *, n_resamples: int, seed: int) -> dict[str, Any]:
    """Share of applicable outputs carrying the style, with a bootstrap interval; None when none applies."""
    applicable = [bool(flag) for flag in flags if flag is not None]
    if not applicable:
        return {"rate": None, "ci": None, "n": 0}
    interval = mean_interval(np.array(applicable, dtype=np.float64), n_resamples=n_resamples, seed=seed)
    return {"rate": round(interval.mean, DIGITS), "ci": interval.as_list(DIGITS), "n": len(applicable)}


def paired_reference(spec: Any, run: Any) -> Any | None:
    """The method `spec`'s ROUGE-1 is paired with: the adapter alone at its history size, else global."""
    history = run.params[spec.name].get("history", "n/a")
    for other in run.specs:
        if (
            other.base == ADAPTER_ALONE
            and other.name != spec.name
            and run.params[other.name].get("history", "n/a") == history
        ):
            return other
    return next((other for other in run.specs if other.base == FLOOR and other.name != spec.name), None)


def _paired_rouge1(spec: Any, reference: Any, run: Any, *, n_resamples: int, seed: int) -> dict[str, Any]:
    keys, scores = query_scores(run.records[spec.name], "rouge1")
    reference_keys, reference_scores = query_scores(run.records[reference.name], "rouge1")
    if keys != reference_keys:
        raise ValueError(
            f"{spec.name} and {reference.name} were scored on different queries; cannot pair them"
        )
    interval = paired_bootstrap(scores, reference_scores, n_resamples=n_resamples, seed=seed)
    return {"method": reference.name, "label": _label(reference), "delta": interval.as_list(DIGITS)}


def summarise_style(style_name: str, run: Any, *, n_resamples: int, seed: int) -> dict[str, Any]:
    """One style's rows: per method hit rate, ROUGE-1 against the restyled gold (also paired), history size."""
    style = get_style(style_name)
    gold_flags = [style.detect(query.reference) for user in run.users for query in user.queries]
    rows: dict[str, Any] = {}
    for spec in run.specs:
        queries = [q for record in run.records[spec.name] for q in record["queries"]]
        r1 = np.array([q["rouge1"] for q in queries], dtype=np.float64)
        reference = paired_reference(spec, run)
        rows[spec.name] = {
            "base": spec.base,
            "label": _label(spec),
            "history": run.params[spec.name].get("history", "n/a"),
            "hit": hit_rate([q.get("style_hit") for q in queries], n_resamples=n_resamples, seed=seed),
            "rouge1": round(float(r1.mean()), DIGITS),
            "rouge1_ci": mean_interval(r1, n_resamples=n_resamples, seed=seed).as_list(DIGITS),
            "rouge1_vs": None
            if reference is None
            else _paired_rouge1(spec, reference, run, n_resamples=n_resamples, seed=seed),
            "n": len(queries),
        }
    return {
        "style": style.name,
        "kind": style.kind,
        "description": style.description,
        "gold_hit": hit_rate(gold_flags, n_resamples=n_resamples, seed=seed),
        "methods": rows,
    }


def run_probes(
    config: ProbeConfig,
    *,
    personalizer: Any = None,
    progress: Progress | None = None,
    notify: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run every style (resuming from each run's cache) and write probes.json, probes.md and probes.png.

    `notify` gets each note on how the data file was read (`bench.data.BenchFile.notes`), once: every style
    reads the same file.
    """
    from localpers.bench import run_and_write
    from localpers.methods.card.personalizer import Personalizer

    for name in config.styles:
        get_style(name)  # refuse an unknown style before loading anything
    check_output_directory(config.out)
    names = probe_method_names(config.methods, config.history_sizes)
    owned = personalizer is None
    if personalizer is None:
        personalizer = Personalizer.open(model=config.model, bundle=config.bundle, n_threads=config.threads)
    try:
        styles = []
        for index, name in enumerate(config.styles):
            bench = BenchConfig(
                data=config.data,
                out=config.out / name,
                methods=names,
                max_users=config.max_users,
                max_queries=config.max_queries,
                seed=config.seed,
                bundle=config.bundle,
                model=config.model,
                n_resamples=config.n_resamples,
                threads=config.threads,
                command=config.command,
                style=name,
                dev_split=config.dev_split,
            )
            written = run_and_write(
                bench,
                personalizer=personalizer,
                progress=None if progress is None else _prefixed(progress, name),
                notify=notify if index == 0 else None,
            )
            styles.append(
                summarise_style(name, written.run, n_resamples=config.n_resamples, seed=config.seed)
            )
        context = written.results["config"]
    finally:
        if owned:
            personalizer.close()
    probes = {
        "config": {
            "command": config.command,
            "styles": config.styles,
            "methods": names,
            "history_sizes": ["all" if s is None else s for s in config.history_sizes],
            "queries_per_user": config.max_queries,
            "dev_split": config.dev_split,
            "n_users": context["n_users"],
            "n_queries": context["n_queries"],
            "bundle": context["bundle"],
            "bundle_sha256": context["bundle_sha256"],
            "data": context["data"],
            "data_sha256": context["data_sha256"],
        },
        "styles": styles,
    }
    config.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(config.out / "probes.json", json.dumps(probes, indent=2, ensure_ascii=False) + "\n")
    plot = plot_probes(probes, config.out / "probes.png")
    atomic_write_text(config.out / "probes.md", render_probes(probes, image=plot.name if plot else None))
    return probes


def _prefixed(progress: Progress, style: str) -> Progress:
    def report(method: str, done: int, total: int, detail: str) -> None:
        progress(f"{style}: {method}", done, total, detail)

    return report


def _percent(hit: dict[str, Any]) -> str:
    if hit["rate"] is None:
        return "n/a"
    low, _, high = hit["ci"]
    return f"{100 * hit['rate']:.0f}% [{100 * low:.0f}, {100 * high:.0f}] (n={hit['n']})"


def _paired_cell(paired: dict[str, Any] | None) -> str:
    if not paired or not paired.get("delta"):  # none, or one probe item: no interval
        return "–"
    low, mean, high = paired["delta"]
    star = " *" if low > 0 or high < 0 else ""
    return f"{mean:+.4f} [{low:+.4f}, {high:+.4f}]{star} vs {paired['label']}"


def render_probes(probes: dict[str, Any], *, image: str | None = None) -> str:
    """probes.md: one table per style (hit rate with interval, ROUGE-1 against the restyled gold)."""
    config = probes["config"]
    lines = [
        "# Style probes",
        "",
        f"{config['n_users']} users, up to {config['queries_per_user']} queries each ({config['n_queries']} in all); "
        f"bundle `{config['bundle']}`.",
        f"Command: `{config['command']}`" if config.get("command") else "",
        "",
        "Hit rate: share of outputs carrying the style (95% bootstrap interval over queries; n = outputs the "
        "detector applies to). R-1 is against the restyled gold; ΔR-1 is paired over the same queries, to the "
        "conditioned adapter alone at the same history size where it was run, else to global (* = the 95% "
        "interval excludes 0).",
        "",
    ]
    for style in probes["styles"]:
        lines += [
            f"## {style['style']} ({style['kind']}): {style['description']}",
            "",
            f"Restyled gold carries it: {_percent(style['gold_hit'])}",
            "",
            "| method | history | hit rate | R-1 [95% CI] | ΔR-1 [95% CI] |",
            "|---|---:|---|---|---|",
        ]
        for row in style["methods"].values():
            low, mean, high = row["rouge1_ci"]
            history = "all" if row["history"] is None else row["history"]
            lines.append(
                f"| {row.get('label', row['base'])} | {history} | {_percent(row['hit'])} | "
                f"{mean:.4f} [{low:.4f}, {high:.4f}] | {_paired_cell(row.get('rouge1_vs'))} |"
            )
        lines.append("")
    if image:
        lines += [f"![hit rate against history size]({image})", ""]
    return "\n".join(line for line in lines if line is not None) + "\n"


def plot_probes(probes: dict[str, Any], path: Path) -> Path | None:
    """One panel per style: hit rate against history size, a line per method, the global adapter dashed."""
    from localpers.bench.plots import save_figure
    from localpers.plotting import pyplot

    plt = pyplot()
    styles = probes["styles"]
    if not styles:
        return None
    sizes = probes["config"]["history_sizes"]
    positions = {size: index for index, size in enumerate(sizes)}
    figure, axes = plt.subplots(1, len(styles), figsize=(3.6 * len(styles), 3.4), sharey=True, squeeze=False)
    for axis, style in zip(axes[0], styles, strict=True):
        curves: dict[str, list[tuple[int, float, float, float]]] = {}
        for row in style["methods"].values():
            hit = row["hit"]
            if hit["rate"] is None:
                continue
            if row["history"] == "n/a":
                axis.axhline(hit["rate"], linestyle="--", color="grey", label=row.get("label", row["base"]))
                continue
            size = "all" if row["history"] is None else row["history"]
            if size in positions:
                curves.setdefault(row.get("label", row["base"]), []).append((positions[size], *hit["ci"]))
        for base, points in curves.items():
            points.sort()
            x = [p[0] for p in points]
            mean = [p[2] for p in points]
            axis.errorbar(
                x,
                mean,
                yerr=[[p[2] - p[1] for p in points], [p[3] - p[2] for p in points]],
                marker="o",
                capsize=3,
                label=base,
            )
        axis.set_title(f"{style['style']} ({style['kind']})")
        axis.set_xticks(range(len(sizes)), [str(s) for s in sizes])
        axis.set_xlabel("history items")
        axis.set_ylim(-0.02, 1.02)
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("hit rate")
    axes[0][-1].legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    return save_figure(figure, path, dpi=110)
