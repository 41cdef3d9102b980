"""Engine jobs on daemon threads of their own, which quitting the app does not wait for.

What it does: start a job on a thread, cancel the jobs of a group (a newer job of a group cancels the older
ones, as a newer generation does), cancel them all, and say whether any still runs. A thread cannot be
stopped: a job learns it was cancelled from the `JobThread` it is given (`is_cancelled`) at its next check.

Why not Textual's thread workers: they run on asyncio's default executor, which `asyncio.run` joins when the
app's loop ends, so `App.run()` returned only once the engine's current step had (loading a model, a CoPe
fit's torch load: seconds), with the terminal already handed back, nothing on it, and no way for the
command to say why or to stop waiting. On threads of our own, `run_app` gets control back at once and
decides how long to wait for the engine (`LocalpersApp.close_service`).

What it does not do: hold the engine lock or post messages (the jobs in `localpers.tui.engine_jobs` do).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

THREAD_PREFIX = "localpers-job-"  # tests join the threads named so before the next test uses the engine


class JobThread:
    """One job: its group, whether it was cancelled, and whether its thread still runs."""

    def __init__(self, group: str, name: str) -> None:
        self.group = group
        self.name = name
        self._cancelled = threading.Event()
        self.thread: threading.Thread | None = None

    @property
    def is_cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def is_running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()


Work = Callable[[JobThread], None]
Crash = Callable[[JobThread, Exception], None]


class JobThreads:
    """The app's running jobs. `on_crash` hears of an exception a job let through (a job reports its own
    errors as messages; what reaches here is a defect, which must not go unsaid nor print over the screen)."""

    def __init__(self, on_crash: Crash) -> None:
        self._on_crash = on_crash
        self._jobs: list[JobThread] = []
        self._lock = threading.Lock()

    def start(self, group: str, name: str, work: Work) -> JobThread:
        """Cancel the group's running jobs, then run `work(job)` on a new daemon thread."""
        self.cancel_group(group)
        job = JobThread(group, name)
        job.thread = threading.Thread(
            target=self._run, args=(job, work), name=f"{THREAD_PREFIX}{name}", daemon=True
        )
        with self._lock:
            self._jobs = [known for known in self._jobs if known.is_running]
            self._jobs.append(job)
        job.thread.start()
        return job

    def _run(self, job: JobThread, work: Work) -> None:
        try:
            work(job)
        except Exception as exc:
            self._on_crash(job, exc)

    def _running(self) -> list[JobThread]:
        with self._lock:
            return [job for job in self._jobs if job.is_running]

    def cancel_group(self, group: str) -> None:
        for job in self._running():
            if job.group == group:
                job.cancel()

    def cancel_all(self) -> None:
        for job in self._running():
            job.cancel()

    @property
    def any_running(self) -> bool:
        return bool(self._running())
