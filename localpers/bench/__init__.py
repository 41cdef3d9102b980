"""`localpers bench`: evaluate CARD and its baselines on held-out authors (the evaluation protocol of the
project's design notes, `../shared/DESIGN.md` section 7).

Modules: `data` (the shared-data users), `methods` (the interface a bench method implements), `registry` and
`method_names` (the methods and their `NAME@key=value` spellings), `prompt_methods`, `card_methods` and
`extra_methods` (the methods), `metrics` (ROUGE, paired bootstrap), `authors` (per-author figures), `siblings`,
`styles` and `probes` (where the gain is, and the style probes), `fits` (per-user fits), `runner` (generation,
the per-(method, user) cache), `results` (results.json, outputs.jsonl), `targets` (issue 20's targets),
`report` (report.md), `plots`.
`run_and_write` ties them together; it is what the CLI calls.

A run's top-level outputs (results.json, outputs.jsonl, report.md, the plots) are one set: they are written
into a staging folder inside `--out`, then moved into place by `publish_outputs`, which removes the earlier
run's results.json first and moves the new one last. Whatever interrupts it, a results.json in `--out` means
every output beside it is from the same run; without one, the other outputs there are incomplete.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localpers.bench.runner import BenchConfig, BenchRun, Progress, run_bench

__all__ = ["BenchConfig", "BenchOutputs", "publish_outputs", "run_and_write"]

RESULTS_NAME, OUTPUTS_NAME, REPORT_NAME = "results.json", "outputs.jsonl", "report.md"
STAGING_NAME = ".staging"  # inside --out: the same file system, so each move is a rename


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

    with contextlib.ExitStack() as hold:  # --out stays locked until the outputs are in place
        run = run_bench(config, personalizer=personalizer, progress=progress, notify=notify, hold=hold)
        results = build_results(run)
        out = config.out
        staging = out / STAGING_NAME
        shutil.rmtree(staging, ignore_errors=True)  # a killed run's (none runs beside us: the lock)
        try:
            staging.mkdir()
            write_results(results, staging / RESULTS_NAME)
            write_outputs(run, staging / OUTPUTS_NAME)
            plots = write_plots(results, staging)
            atomic_write_text(staging / REPORT_NAME, render_report(results, images=[p.name for p in plots]))
            publish_outputs(staging, out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return BenchOutputs(
        results,
        out / RESULTS_NAME,
        out / OUTPUTS_NAME,
        out / REPORT_NAME,
        [out / plot.name for plot in plots],
        run,
    )


def publish_outputs(staging: Path, out: Path) -> None:
    """Move every file of `staging` into `out` as one set, removing the earlier run's outputs it replaces or
    does not make (a plot this run has no methods for), so no figure of another run stays beside the results.

    The earlier results.json goes first and the new one comes last: at every step, a results.json in `out`
    has only its own run's outputs beside it.
    """
    from localpers.atomic import fsync_directory
    from localpers.bench.plots import PLOT_NAMES

    made = {path.name for path in staging.iterdir()}
    (out / RESULTS_NAME).unlink(missing_ok=True)
    fsync_directory(out)
    for name in (OUTPUTS_NAME, REPORT_NAME, *PLOT_NAMES):
        if name in made:
            os.replace(staging / name, out / name)
        else:
            (out / name).unlink(missing_ok=True)
    os.replace(staging / RESULTS_NAME, out / RESULTS_NAME)
    fsync_directory(out)
