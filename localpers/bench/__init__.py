"""`localpers bench`: evaluate CARD and its baselines on held-out authors (DESIGN.md section 7).

Modules: `data` (the shared-data users), `methods` (the registry: global, rag, cluster, card, ...),
`metrics` (ROUGE, paired bootstrap), `retrieval` (BM25 for rag), `fits` (per-user fits), `runner` (generation, the
per-(method, user) cache), `results` (results.json, outputs.jsonl), `report` (report.md), `plots`.
`run_and_write` ties them together; it is what the CLI calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localpers.bench.runner import BenchConfig, BenchRun, Progress, run_bench

__all__ = ["BenchConfig", "BenchOutputs", "run_and_write"]


@dataclass
class BenchOutputs:
    """What a run wrote and its results object."""

    results: dict[str, Any]
    results_path: Path
    outputs_path: Path
    report_path: Path
    plots: list[Path]
    run: BenchRun


def run_and_write(
    config: BenchConfig,
    *,
    personalizer: Any = None,
    progress: Progress | None = None,
    notify: Callable[[str], None] | None = None,
) -> BenchOutputs:
    """Run (resuming from the cache), then write results.json, outputs.jsonl, report.md and the plots.

    `notify` gets each note on how the data file was read (`bench.data.BenchFile.notes`), before the run.
    """
    from localpers.atomic import atomic_write_text
    from localpers.bench.plots import write_plots
    from localpers.bench.report import render_report
    from localpers.bench.results import build_results, write_outputs, write_results

    run = run_bench(config, personalizer=personalizer, progress=progress, notify=notify)
    results = build_results(run)
    out = config.out
    write_results(results, out / "results.json")
    write_outputs(run, out / "outputs.jsonl")
    plots = write_plots(results, out)
    report = render_report(results, images=[p.name for p in plots])
    atomic_write_text(out / "report.md", report)
    return BenchOutputs(results, out / "results.json", out / "outputs.jsonl", out / "report.md", plots, run)
