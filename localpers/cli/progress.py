"""Progress of a fit for the commands that run one (`fit`, `demo`): a bar on a terminal, log lines elsewhere.

It only reports what the Personalizer's `(stage, done, total)` callback tells; it starts no work itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from localpers.cli.common import echo
from localpers.methods.reports import FIT_STAGE_LABELS

LOG_EVERY_SECONDS = 10.0  # without a terminal, a long stage logs a line this often


@contextmanager
def fit_progress(enabled: bool, interactive: bool = True, command: str = "fit") -> Iterator[Any]:
    """A rich progress bar fed by the Personalizer's (stage, done, total) callback.

    Without a terminal (nohup, CI logs, pipes) it logs `<command>: <stage> <done>/<total>` lines on standard
    error instead: when a stage ends, and every LOG_EVERY_SECONDS while it runs (an EXACT fit takes minutes).
    Disabled, it reports nothing.
    """
    if not enabled:
        yield None
        return
    if not interactive:
        yield _stage_logger(command)
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("{task.description:<26}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        transient=True,
    ) as progress:
        tasks: dict[str, Any] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = progress.add_task(FIT_STAGE_LABELS.get(stage, stage), total=total)
            progress.update(tasks[stage], completed=done)

        yield update


def _stage_logger(command: str) -> Any:
    # a stage's first report comes after its first unit of work: it is timed from the previous stage's end
    previous_end = time.monotonic()
    started: dict[str, float] = {}
    logged: dict[str, float] = {}

    def update(stage: str, done: int, total: int) -> None:
        nonlocal previous_end
        now = time.monotonic()
        started.setdefault(stage, previous_end)
        if done < total and now - logged.get(stage, started[stage]) < LOG_EVERY_SECONDS:
            return
        logged[stage] = now
        elapsed = now - started[stage]
        if done >= total:
            previous_end = now
            timing = f" ({elapsed:.1f} s)"
        else:  # at the pace so far
            timing = f", about {_duration(elapsed / done * (total - done))} left" if done > 0 else ""
        echo(f"{command}: {FIT_STAGE_LABELS.get(stage, stage)} {done}/{total}{timing}", err=True)

    return update


def _duration(seconds: float) -> str:
    """`42 s`, `7 min`, `2.3 h`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
