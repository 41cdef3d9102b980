"""Quitting the TUI does not wait, silently, for the engine's current step (eighty-seventh session).

The engine jobs ran in Textual thread workers, on asyncio's default executor, which `asyncio.run` joins as the
app's loop ends: `App.run()` returned only once the step did (a model load, a CoPe fit's torch load), with the
terminal already handed back and nothing said, and `close_service`'s timeout never came into play.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from tui_fakes import FakeService
from tui_helpers import join_job_threads, make_app

from localpers.tui.app import LocalpersApp
from localpers.tui.job_threads import JobThread, JobThreads
from localpers.tui.service import EngineInfo
from localpers.users.store import UserStore

STEP_SECONDS = 4.0


class StuckLoad(FakeService):
    """A model load that no cancel reaches for STEP_SECONDS (or until `release` is set)."""

    def __init__(self) -> None:
        super().__init__(UserStore())
        self.started = threading.Event()
        self.release = threading.Event()

    def load(self) -> EngineInfo:
        self.started.set()
        self.release.wait(STEP_SECONDS)
        return super().load()


def test_quitting_during_a_step_returns_at_once_and_closes_when_the_step_ends() -> None:
    service = StuckLoad()
    app = make_app(service)

    async def quit_while_loading() -> None:
        async with app.run_test() as pilot:
            assert await asyncio.to_thread(service.started.wait, 10)
            await pilot.pause()
            app.exit()

    began = time.monotonic()
    asyncio.run(quit_while_loading())
    left_after = time.monotonic() - began
    try:
        assert left_after < STEP_SECONDS - 1, (
            f"the app's loop waited {left_after:.1f} s for the engine's step"
        )
        told: list[bool] = []
        # the step still runs: the engine is not closed under it, and the command says why it waits
        assert not app.close_service(timeout=0.3, on_wait=lambda: told.append(True), patience=0.1)
        assert told == [True] and not service.closed
        service.release.set()
        assert app.close_service(timeout=10, on_wait=lambda: told.append(True))
        assert service.closed
    finally:
        service.release.set()
        join_job_threads()


def test_close_service_says_nothing_when_the_engine_is_free() -> None:
    service = FakeService(UserStore())
    app = LocalpersApp(service)  # never run: no job holds the engine
    told: list[bool] = []
    assert app.close_service(on_wait=lambda: told.append(True))
    assert service.closed and not told


def test_a_newer_job_cancels_only_its_own_group() -> None:
    crashes: list[str] = []
    jobs = JobThreads(on_crash=lambda job, error: crashes.append(job.name))
    gate = threading.Event()

    def waiting(job: JobThread) -> None:
        gate.wait(10)

    fit = jobs.start("fit", "fit", waiting)
    first = jobs.start("generate", "generate", waiting)
    second = jobs.start("generate", "generate", waiting)
    assert first.is_cancelled and not second.is_cancelled and not fit.is_cancelled
    assert jobs.any_running
    jobs.cancel_all()
    assert fit.is_cancelled and second.is_cancelled
    gate.set()
    join_job_threads()
    assert not jobs.any_running and not crashes


def test_an_exception_a_job_lets_through_is_reported_not_printed(capsys: pytest.CaptureFixture[str]) -> None:
    crashes: list[tuple[str, str]] = []
    jobs = JobThreads(on_crash=lambda job, error: crashes.append((job.name, str(error))))

    def broken(job: JobThread) -> None:
        raise ValueError("a defect in the job")

    jobs.start("fit", "fit", broken)
    join_job_threads()
    assert crashes == [("fit", "a defect in the job")]
    assert "Traceback" not in capsys.readouterr().err
