"""report.md from a results.json object: a Table-1-style table, targets, comparisons, the gain by sibling
score, curves, per-user fits.

`render_report(results, image_prefix="")` returns Markdown; images are linked as
`<image_prefix><name>.png` for the figures listed in `images`. Numbers only: no generated or
reference text ever goes into a report. This module neither runs nor plots anything.
"""

from __future__ import annotations

import math
from typing import Any

from localpers.bench.authors import improved_text
from localpers.bench.plots import history_curves, sweep_points


def _num(value: float | None, digits: int = 4) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _interval(iv: list[float] | None, digits: int = 4, signed: bool = True, null: float = 0.0) -> str:
    """ "mean [low, high]", with " *" when the interval excludes `null` (0 for a difference, 1 for a ratio)."""
    if not iv:
        return "–"
    sign = "+" if signed else ""
    marker = " *" if (iv[0] > null or iv[2] < null) else ""
    return f"{iv[1]:{sign}.{digits}f} [{iv[0]:{sign}.{digits}f}, {iv[2]:{sign}.{digits}f}]{marker}"


def main_table(results: dict[str, Any]) -> list[str]:
    lines = [
        "| Method | R-1 | R-L | ΔR-1 vs global [95% CI] | R-1 / global [95% CI] | ΔR-L vs global [95% CI] | ms/token | fit s/user | bytes/user |",
        "|---|---:|---:|---|---|---|---:|---:|---:|",
    ]
    for name, row in results["methods"].items():
        delta = results["deltas_vs_global"].get(name, {})
        lines.append(
            f"| {name} | {_num(row['rouge1'])} | {_num(row['rougeL'])} | {_interval(delta.get('rouge1'))} "
            f"| {_interval(delta.get('rouge1_ratio'), 3, signed=False, null=1.0) if delta else '1.000'} "
            f"| {_interval(delta.get('rougeL'))} | {_num(row['ms_per_token'], 2)} "
            f"| {_num(row['fit_s_per_user'], 2)}{' †' if row.get('fit_shared_negatives') else ''} "
            f"| {row['bytes_per_user']} |"
        )
    return lines


def targets_table(results: dict[str, Any]) -> list[str]:
    """The product's targets for the default method: what each asks, what this run measured, met or not."""
    targets = results.get("targets")
    if not targets:
        return []
    status = {True: "**met**", False: "**not met**", None: "not judged"}
    lines = ["| target | measured | |", "|---|---|---|"]
    lines += [f"| {c['target']} | {c['measured']} | {status[c['met']]} |" for c in targets["checks"]]
    return lines


def author_table(results: dict[str, Any]) -> list[str]:
    """Per method: authors improved over global, and the ratio and difference with intervals over authors."""
    rows = results.get("authors_vs_global") or {}
    if not rows:
        return []
    lines = [
        "| Method | authors improved | R-1 / global [95% CI over authors] | ΔR-1 vs global [95% CI over authors] |",
        "|---|---:|---|---|",
    ]
    for name, row in rows.items():
        lines.append(
            f"| {name} | {improved_text(row['improved'], row['authors'], row['unchanged'])} "
            f"| {_interval(row['rouge1_ratio'], 3, signed=False, null=1.0)} | {_interval(row['rouge1'])} |"
        )
    return lines


def cost_table(results: dict[str, Any]) -> list[str]:
    """Per method: decode and whole-rewrite time, each also as a ratio to global's, fit time and stored bytes."""
    rows = results["methods"]
    base = rows.get("global")
    if base is None or "rewrite_ms" not in base:
        return []

    def ratio(row: dict[str, Any], key: str) -> str:
        return f"{row[key] / base[key]:.2f}x" if base[key] else "–"

    lines = [
        "| Method | decode ms/token | / global | prompt ms | tokens per output | whole rewrite ms | / global "
        "| fit s/user | bytes/user |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in rows.items():
        if "rewrite_ms" not in row:
            continue
        lines.append(
            f"| {name} | {_num(row['ms_per_token'], 2)} | {ratio(row, 'ms_per_token')} | {_num(row['prompt_ms'], 1)} "
            f"| {_num(row['tokens_per_output'], 1)} | {_num(row['rewrite_ms'], 1)} | {ratio(row, 'rewrite_ms')} "
            f"| {_num(row['fit_s_per_user'], 2)} | {row['bytes_per_user']} |"
        )
    return lines


def comparison_tables(results: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for baseline, table in results.get("deltas_vs", {}).items():
        if not table:
            continue
        lines += [
            "",
            f"Paired differences to `{baseline}` (ROUGE-1, 95% CI; * = interval excludes 0):",
            "",
            "| Method | ΔR-1 | ΔR-L |",
            "|---|---|---|",
        ]
        lines += [
            f"| {name} | {_interval(d['rouge1'])} | {_interval(d['rougeL'])} |" for name, d in table.items()
        ]
    return lines


def low_resource_table(results: dict[str, Any]) -> list[str]:
    curves = history_curves(results)
    if not curves:
        return []
    rows = results["methods"]
    limits = sorted(
        {h for points in curves.values() for h, _ in points}, key=lambda h: math.inf if h is None else h
    )
    lines = [
        "| history items | " + " | ".join(curves) + " | global |",
        "|---|" + "---:|" * (len(curves) + 1),
    ]
    for limit in limits:
        cells = []
        for points in curves.values():
            name = dict(points).get(limit)
            cells.append(_num(rows[name]["rouge1"]) if name else "–")
        global_r1 = _num(rows["global"]["rouge1"]) if "global" in rows else "–"
        lines.append(f"| {'all' if limit is None else limit} | " + " | ".join(cells) + f" | {global_r1} |")
    return lines


def sweep_table(results: dict[str, Any], param: str) -> list[str]:
    points = sweep_points(results, param)
    if not points:
        return []
    rows = results["methods"]
    lines = [f"| {param} | R-1 | R-L | ΔR-1 vs global [95% CI] |", "|---:|---:|---:|---|"]
    for value, name in points:
        delta = results["deltas_vs_global"].get(name, {}).get("rouge1")
        lines.append(
            f"| {value:g} | {_num(rows[name]['rouge1'])} | {_num(rows[name]['rougeL'])} | {_interval(delta)} |"
        )
    return lines


def gold_table(results: dict[str, Any]) -> list[str]:
    """Gold likelihood per method, with the paired difference to global (methods that score it)."""
    rows = {name: row for name, row in results["methods"].items() if row.get("gold_logprob") is not None}
    if not rows:
        return []
    lines = [
        "| Method | log p per token [95% CI] | perplexity | Δ vs global [95% CI] |",
        "|---|---|---:|---|",
    ]
    for name, row in rows.items():
        delta = results["deltas_vs_global"].get(name, {}).get("gold_logprob")
        lines.append(
            f"| {name} | {row['gold_logprob_ci'][1]:.3f} [{row['gold_logprob_ci'][0]:.3f}, {row['gold_logprob_ci'][2]:.3f}] "
            f"| {_num(row['gold_perplexity'], 2)} | {_interval(delta, 3) if delta else '–'} |"
        )
    return lines


def sibling_lines(results: dict[str, Any]) -> list[str]:
    """The queries by sibling score (`localpers.bench.siblings`) and each method's figures per bin."""
    entry = results.get("by_sibling")
    if not entry or not entry["methods"]:
        return []
    baseline = entry.get("baseline", "global")
    counts = "; ".join(
        f"{b['name']}: {b['queries']} queries ({b['authors']} author{'s' if b['authors'] != 1 else ''})"
        for b in entry["bins"]
    )
    lines = [
        f"Queries by their sibling score: {counts}.",
        "",
        f"| Method | sibling score | queries | {baseline} R-1 | R-1 | / {baseline} | Δ R-1 [95% CI] |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for method, row in entry["methods"].items():
        for cell in row["bins"]:
            if not cell["n"]:
                continue
            ratio = "–" if cell["ratio"] is None else f"{cell['ratio']:.3f}"
            lines.append(
                f"| {method} | {cell['bin']} | {cell['n']} | {cell['baseline_rouge1']:.4f} | {cell['rouge1']:.4f} "
                f"| {ratio} | {_interval(cell['delta'])} |"
            )
    if entry.get("left_out"):
        lines += [
            "",
            "Not binned (fitted on another window of the history than the bins): "
            + "; ".join(f"`{name}` {why}" for name, why in entry["left_out"].items())
            + ".",
        ]
    needed = [
        f"`{method}` {row['top_share_for_target']:.1%}"
        for method, row in entry["methods"].items()
        if row["top_share_for_target"] is not None
    ]
    if needed:
        top = entry["bins"][-1]
        share = top["queries"] / max(1, sum(b["queries"] for b in entry["bins"]))
        lines += [
            "",
            f"Share of queries with a sibling score {top['name']} at which each method would reach "
            f"{entry['target']}x {baseline} overall, every bin's means held and the other bins in proportion: "
            f"{', '.join(needed)} (this run: {share:.1%}).",
        ]
    return lines


def user_table(results: dict[str, Any]) -> list[str]:
    users = results.get("users", {})
    if not users or not any("cluster" in row for row in users.values()):
        return []
    lines = [
        "| user | history | cluster | fit mode | pairs | held-out pair acc. (fitted / cluster default) |",
        "|---|---:|---:|---|---:|---|",
    ]
    for user_id, row in users.items():
        heldout = (
            f"{_num(row.get('heldout_accuracy'), 2)} / {_num(row.get('heldout_accuracy_default'), 2)} (n={row.get('n_heldout')})"
            if row.get("heldout_accuracy") is not None
            else "–"
        )
        lines.append(
            f"| {user_id} | {row['history_items']} | {row.get('cluster')} | {row.get('mode') or '–'} "
            f"| {row.get('n_pairs') if row.get('n_pairs') is not None else '–'} | {heldout} |"
        )
    return lines


def render_report(results: dict[str, Any], *, images: list[str] = (), image_prefix: str = "") -> str:
    """The whole report as Markdown."""
    config = results["config"]
    out = [
        "# localpers bench: results",
        "",
        f"Data `{config['data']}` ({config['n_users']} users, {config['n_queries']} queries, sha256 {config['data_sha256'][:12]}); "
        f"bundle `{config['bundle']}` (manifest sha256 {config['bundle_sha256'][:12]}); backbone `{config['backbone']}`.",
        f"Head: {config['head']}. llama.cpp threads: {config.get('threads')}. Bootstrap: {config['bootstrap_resamples']} paired resamples of queries, seed {config['seed']}.",
    ]
    if config.get("command"):
        out += ["", "Command:", "", f"    {config['command']}"]
    if config.get("data_notes"):
        out += ["", "How the data file was read:", "", *(f"- {note}" for note in config["data_notes"])]
    if config.get("run_notes"):
        out += ["", "How the run was made:", "", *(f"- {note}" for note in config["run_notes"])]
    out += [
        "",
        "ROUGE F1 with stemming, mean over all queries. Δ = paired difference to `global` on the same queries "
        "(* = 95% interval excludes 0; on the ratio to `global`, excludes 1). ms/token = decode time per generated token (prompt excluded). "
        "fit s/user = what the method computes per user before generating (CARD: cluster, negatives, pair "
        "features, vector; † = the y- were reused from the full-history fit, so their generation is not "
        "counted). bytes/user = what the device stores per user besides their own history.",
        "",
        *main_table(results),
        *comparison_tables(results),
    ]
    if "bars.png" in images:
        out += ["", f"![ROUGE-1 per method]({image_prefix}bars.png)"]
    table = targets_table(results)
    if table:
        out += [
            "",
            f"## Targets: `{results['targets']['method']}` (the default) against global",
            "",
            f"{results['targets']['summary']}. The product's targets (issue 20), each read off this run's "
            'figures below (the costs from "Cost against global"); the style probes are a separate run '
            "(`localpers bench --probes`).",
            "",
            *table,
        ]
    table = author_table(results)
    if table:
        out += [
            "",
            "## Per author",
            "",
            "Gains concentrate in a few authors, so the intervals here resample authors (each drawn author brings "
            "all of their queries) instead of queries. An author is improved when the method's mean ROUGE-1 over "
            "their queries is above global's.",
            "",
            *table,
        ]
        if "authors.png" in images:
            out += ["", f"![ROUGE-1 gain over global per author]({image_prefix}authors.png)"]
    table = sibling_lines(results)
    if table:
        out += [
            "",
            "## Where the gain comes from: queries by their closest earlier headline",
            "",
            "A query's sibling score is the best ROUGE-1 of any of the author's history headlines against the "
            "author's real headline for it: a property of the data, chosen with the answer, that no method sees "
            "(high for a formula such as a weekly series, middling for a shared subject). A ratio over all "
            "queries depends on how many queries have a sibling as much as on the method.",
            "",
            *table,
        ]
        if "siblings.png" in images:
            out += ["", f"![ROUGE-1 gain over global by sibling score]({image_prefix}siblings.png)"]
    table = gold_table(results)
    if table:
        out += [
            "",
            "## Gold likelihood (teacher-forced log-probability of the author's own headline)",
            "",
            "Mean per-token natural-log probability of ` <reference>\\n` under each method's final next-token "
            "distribution, computed by the same sampler chain and correction hook that generate, the reference's "
            "tokens evaluated in one batch (CARD's correction moves its top k; tokens outside the top k keep the "
            "adapter's logits, for every method alike), without the decoding rules that are not the model's (the "
            "task's word-only repetition rule, llama.cpp's penalties) or habits applied to the finished text. "
            "Higher is better; Δ is paired over queries.",
            "",
            *table,
        ]
    table = cost_table(results)
    if table:
        out += [
            "",
            "## Cost against global",
            "",
            "Means over the queries of this run. A whole rewrite is the prompt's evaluation (the user's shared "
            "examples stay cached between one user's queries, as on the device) plus every generated token. The "
            "methods ran user by user, each in turn, so a machine whose speed drifts over the run moves them "
            "alike; `scripts/bench_rewrite.py` interleaves them rewrite by rewrite for a finer comparison.",
            "",
            *table,
        ]
    table = low_resource_table(results)
    if table:
        out += ["", "## Low-resource curve (ROUGE-1, history truncated to the most recent items)", "", *table]
        if "low_resource.png" in images:
            out += ["", f"![Low-resource curve]({image_prefix}low_resource.png)"]
    for param, title, image in (
        ("strength", "Strength α sweep", "alpha_sweep.png"),
        ("top_k", "Top-k sweep", "topk_sweep.png"),
    ):
        table = sweep_table(results, param)
        if table:
            out += ["", f"## {title} (CARD)", "", *table]
            if image in images:
                out += ["", f"![{title}]({image_prefix}{image})"]
    table = user_table(results)
    if table:
        out += ["", "## Per-user CARD fits", "", *table]
    return "\n".join(out) + "\n"
