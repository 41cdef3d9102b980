"""Where the publisher's independent tasks run: in this process, one after another, or as Ray tasks.

A stage hands a list of calls (`Task`: a module-level function and its picklable arguments) plus the
resources one call needs (`Resources`) to `Executor.map`, and gets the results back in the order it
gave the calls. `SequentialExecutor` runs them here, in order; `localpers.publish.ray_executor` runs the
same functions as Ray tasks (`pipeline.make_executor` picks one) (retried when a worker dies). The task functions write their outputs to the
stage directory themselves, so a shard or adapter finished before an interruption is not redone.
This module does not import Ray and knows nothing of what the tasks compute.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from localpers.errors import LocalpersError

EXECUTORS = ("sequential", "ray")
GIB = 1024**3


@dataclass(frozen=True)
class Resources:
    """What one task declares to the scheduler: CPU cores, memory (bytes) and GPUs (fractions allowed)."""

    cpus: float = 1.0
    memory: int = 1 * GIB
    gpus: float = 0.0

    def __str__(self) -> str:
        """e.g. "1 CPU, 4 GiB, no GPU" (what the progress log says a task asks for)."""
        gpus = "no GPU" if not self.gpus else f"{self.gpus:g} GPU"
        return f"{self.cpus:g} CPU, {self.memory / GIB:g} GiB, {gpus}"


@dataclass(frozen=True)
class Task:
    """One call: `function(*args)`; `label` names it in progress lines and error messages."""

    function: Callable[..., Any]
    args: tuple[Any, ...] = ()
    label: str = ""


@dataclass
class ExecutorInfo:
    """What the run was executed on, recorded in the log and the `publish` result."""

    kind: str
    workers: float = 1.0
    gpus: float = 0.0
    address: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Executor(Protocol):
    info: ExecutorInfo

    def map(
        self,
        tasks: Sequence[Task],
        resources: Resources,
        on_done: Callable[[int, Any], None] | None = None,
    ) -> list[Any]:
        """Run every task; results in task order. `on_done(index, result)` is called as each finishes."""
        ...

    def gpus_per_task(self, requested: float | None) -> float:
        """GPUs a GPU-capable task should declare: `requested`, or (None) 1 when the cluster has GPUs."""
        ...

    def check_resources(self, resources: Resources) -> None:
        """Refuse, in one line, a task no worker could ever run (before the run starts, not when it is due)."""
        ...

    def close(self) -> None: ...


class SequentialExecutor:
    """Every task in this process, in the order given: today's single-process publisher."""

    def __init__(self) -> None:
        self.info = ExecutorInfo(kind="sequential")

    def map(
        self,
        tasks: Sequence[Task],
        resources: Resources,
        on_done: Callable[[int, Any], None] | None = None,
    ) -> list[Any]:
        results = []
        for index, task in enumerate(tasks):
            result = task.function(*task.args)
            results.append(result)
            if on_done is not None:
                on_done(index, result)
        return results

    def gpus_per_task(self, requested: float | None) -> float:
        return 0.0  # in-process tasks use a local GPU through torch when there is one; nothing to declare

    def check_resources(self, resources: Resources) -> None:
        return None  # tasks run in this process, one at a time, with what it has

    def close(self) -> None:
        return None


def shards(items: Sequence[Any], size: int) -> list[list[Any]]:
    """`items` cut into consecutive lists of at most `size` (order kept)."""
    if size < 1:
        raise LocalpersError(f"shard size must be at least 1, not {size}")
    return [list(items[i : i + size]) for i in range(0, len(items), size)]
