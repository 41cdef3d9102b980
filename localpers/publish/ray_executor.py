"""Run the publisher's tasks on Ray: a local Ray started here, or an existing cluster (`--ray-address`).

Each `Task` becomes a Ray task with the stage's declared `Resources` (num_cpus, memory, num_gpus) and
`max_retries`, so a task whose worker process dies (killed, out of memory, node lost) is run again; an
exception raised by the task itself is not retried (it would fail the same way) and comes back as the
task's own `LocalpersError` line. Results are collected as tasks finish, in any order, and returned in
task order. A Ray this module started is shut down by `close`; one that was already running (a test
session, a notebook) is left alone. Workers must import the same `localpers` (installed on every node)
and, on more than one node, see the work directory at the same path (a shared filesystem).
This is the only module that imports `ray`, and it does so only when a Ray executor is made.

A local Ray's processes listen on every interface, and whoever can talk to them runs code as the publisher (who
holds the signing keys). Ray guards them with a token, which it wrote to ~/.ray/auth_token readable by every
account (mode 0644 under umask 022); a Ray started here gets a fresh random token through the environment its
processes inherit (readable by this account only) and no file, and a local Ray without a token is refused.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from collections.abc import Callable, Sequence
from typing import Any

from localpers.errors import PUBLISH_EXTRA_HINT, LocalpersError
from localpers.publish.executor import ExecutorInfo, Resources, Task


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise LocalpersError(
            f"--executor ray needs the ray package ({PUBLISH_EXTRA_HINT}), or use --executor sequential"
        ) from None
    return ray


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """A TCP connect to `HOST:PORT` (or `ray://HOST:PORT`) first: Ray itself retries for minutes."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise LocalpersError(f"--ray-address {address!r} is not HOST:PORT, ray://HOST:PORT or 'auto'")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise LocalpersError(
            f"could not start or reach the Ray cluster at {address} ({reason});"
            " check --ray-address or use --executor sequential"
        ) from None


AUTH_MODE = "RAY_AUTH_MODE"
AUTH_TOKEN = "RAY_AUTH_TOKEN"
AUTH_TOKEN_PATH = "RAY_AUTH_TOKEN_PATH"


def use_private_auth_token() -> dict[str, str | None]:
    """Token authentication for a local Ray, with a fresh token in the environment unless one is given
    (RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH naming the publisher's own file). Returns the variables as they were."""
    before = {name: os.environ.get(name) for name in (AUTH_MODE, AUTH_TOKEN, AUTH_TOKEN_PATH)}
    mode = before[AUTH_MODE]
    if mode is not None and mode.strip().lower() != "token":
        raise LocalpersError(
            f"{AUTH_MODE}={mode}: a local Ray without token authentication runs code for anyone who can reach"
            f" this machine's ports; unset {AUTH_MODE} (localpers gives its Ray a token of its own)"
        )
    os.environ[AUTH_MODE] = "token"
    if not before[AUTH_TOKEN] and not before[AUTH_TOKEN_PATH]:
        os.environ[AUTH_TOKEN] = secrets.token_hex(32)
    return before


def restore_environment(values: dict[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _reread_ray_settings() -> None:
    """Ray reads RAY_AUTH_MODE and its token once per process (at import or a first ray.init); a mode set after
    that left this driver without the token its new local processes asked for (`Failed to start GCS`)."""
    from ray._raylet import AuthenticationTokenLoader, Config  # ray is pinned (pyproject.toml)

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


class RayExecutor:
    """Tasks as Ray tasks; `workers` = CPUs of a local Ray (default: all cores), ignored with `address`."""

    def __init__(self, *, address: str | None = None, workers: int | None = None, retries: int = 3) -> None:
        ray = _import_ray()
        self._ray = ray
        self._retries = retries
        self._remote: dict[Callable[..., Any], Any] = {}
        self._started_here = False
        self._environment_before: dict[str, str | None] | None = None
        if workers is not None and workers < 1:
            raise LocalpersError(f"--workers must be at least 1, not {workers}")
        if not ray.is_initialized():
            self._connect(address, workers)
            self._started_here = True
        resources = ray.cluster_resources()
        self.info = ExecutorInfo(
            kind="ray",
            workers=float(resources.get("CPU", 0.0)),
            gpus=float(resources.get("GPU", 0.0)),
            address=address or "local",
            extra={"nodes": len([n for n in ray.nodes() if n.get("Alive")])},
        )

    def _connect(self, address: str | None, workers: int | None) -> None:
        ray = self._ray
        if address is not None:
            check_reachable(address)
        # Workers inherit this process's environment; keep Ray's own chatter out of the progress lines.
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        # Ray reports usage to usage-stats.ray.io unless told not to: a publish sends nothing it was not asked to
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if address is None:
            self._environment_before = use_private_auth_token()
            _reread_ray_settings()
        try:
            if address is None:
                # "local": a new Ray of its own, never a cluster RAY_ADDRESS or `ray start` left on this machine
                # (which would not know the fresh token, and would not be this command's to size or to stop)
                ray.init(
                    address="local",
                    num_cpus=workers,
                    include_dashboard=False,
                    logging_level="ERROR",
                    configure_logging=True,
                )
            else:
                ray.init(address=address, logging_level="ERROR", configure_logging=True)
        except KeyboardInterrupt:
            # A Ctrl-C during ray.init leaves a half-started local Ray (its agents outlived the command).
            with contextlib.suppress(Exception):
                ray.shutdown()
            self._restore_environment()
            raise
        except (ConnectionError, TimeoutError, RuntimeError, ValueError, OSError) as exc:
            self._restore_environment()
            where = f"the Ray cluster at {address}" if address else "a local Ray"
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise LocalpersError(
                f"could not start or reach {where} ({reason}); check --ray-address or use --executor sequential"
            ) from None

    def gpus_per_task(self, requested: float | None) -> float:
        if requested is not None:
            if requested > self.info.gpus:
                raise LocalpersError(
                    f"--gpus-per-task {requested} but the Ray cluster has {self.info.gpus:g} GPU(s)"
                )
            return requested
        return 1.0 if self.info.gpus >= 1 else 0.0

    def check_resources(self, resources: Resources) -> None:
        """Refuse a task no node could ever run (Ray would wait for it forever)."""
        fits = False
        for node in self._ray.nodes():
            if not node.get("Alive"):
                continue
            total = node.get("Resources", {})
            if (
                total.get("CPU", 0.0) >= resources.cpus
                and total.get("GPU", 0.0) >= resources.gpus
                and total.get("memory", float("inf")) >= resources.memory
            ):
                fits = True
        if not fits:
            raise LocalpersError(
                f"no Ray node has {resources.cpus:g} CPU(s), {resources.gpus:g} GPU(s) and"
                f" {resources.memory / 1024**3:.1f} GiB free for one task; lower --threads or add --workers"
            )

    def _remote_function(self, function: Callable[..., Any]) -> Any:
        if function not in self._remote:
            self._remote[function] = self._ray.remote(function)
        return self._remote[function]

    def map(
        self,
        tasks: Sequence[Task],
        resources: Resources,
        on_done: Callable[[int, Any], None] | None = None,
    ) -> list[Any]:
        if not tasks:
            return []
        self.check_resources(resources)
        ray = self._ray
        pending: dict[Any, int] = {}
        for index, task in enumerate(tasks):
            remote = self._remote_function(task.function).options(
                num_cpus=resources.cpus,
                num_gpus=resources.gpus,
                memory=int(resources.memory),
                max_retries=self._retries,
                retry_exceptions=False,
                name=task.label or task.function.__name__,
            )
            pending[remote.remote(*task.args)] = index
        results: list[Any] = [None] * len(tasks)
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    index = pending.pop(ref)
                    results[index] = self._get(ref, tasks[index])
                    if on_done is not None:
                        on_done(index, results[index])
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        return results

    def _get(self, ref: Any, task: Task) -> Any:
        ray = self._ray
        try:
            return ray.get(ref)
        except LocalpersError as exc:  # RayTaskError subclasses the task's own exception type
            cause = getattr(exc, "cause", None)
            raise LocalpersError(str(cause if cause is not None else exc).strip().splitlines()[-1]) from None
        except ray.exceptions.RayTaskError as exc:  # the task raised: its exception's own last line
            lines = [line for line in str(exc).strip().splitlines() if line.strip()]
            raise LocalpersError(
                f"task {task.label or task.function.__name__} failed: {lines[-1] if lines else type(exc).__name__}"
            ) from None
        except ray.exceptions.RayError as exc:  # its worker or node died more often than it was retried
            lines = [line for line in str(exc).strip().splitlines() if line.strip()]
            raise LocalpersError(
                f"task {task.label or task.function.__name__} failed after {self._retries} retries:"
                f" {lines[0] if lines else type(exc).__name__}"
            ) from None

    def _restore_environment(self) -> None:
        if self._environment_before is not None:
            restore_environment(self._environment_before)
            self._environment_before = None

    def close(self) -> None:
        if self._started_here and self._ray.is_initialized():
            self._ray.shutdown()
        self._restore_environment()
