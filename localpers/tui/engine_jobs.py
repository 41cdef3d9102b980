"""The engine work of the TUI, as functions that run on the app's job threads (`localpers.tui.job_threads`).

The engine is not thread-safe, so each function holds `lock` for all of its engine calls: two jobs never
overlap, whichever thread they run on. A thread cannot be killed, so a cancelled job (a newer
generation, or quitting) notices at its next streamed piece or progress step, raises `Superseded` and
gives the lock up. Jobs report only by posting messages (`localpers.tui.messages`, thread-safe); they never
touch widgets. Errors become messages too: a `LocalpersError` keeps its one-line text, anything else is
named by its type, so a failing job never takes the UI down.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from textual.message import Message

from localpers.errors import LocalpersError, UserBusy
from localpers.tui.job_threads import JobThread
from localpers.tui.messages import (
    DemoReady,
    EngineFailed,
    EngineLoaded,
    FitDone,
    FitProgressed,
    GenerationDone,
    GenerationFailed,
    GenerationPiece,
    GenerationStarted,
)
from localpers.tui.runs import Run
from localpers.tui.service import Progress, WritingService
from localpers.untrusted import one_line
from localpers.users.store import User

Post = Callable[[Message], object]


class Superseded(Exception):
    """Raised inside a job's callback to abandon work that a newer request (or quitting) made pointless."""


def describe(error: Exception) -> str:
    """What went wrong, in one line: a native or torch error's message can run over many lines, which a notice
    showed whole."""
    if isinstance(error, LocalpersError):
        return str(error)
    return one_line(" ".join(f"{type(error).__name__}: {error}".split()), limit=500)


def _progress(worker: JobThread, post: Post) -> Progress:
    def report(stage: str, done: int, total: int) -> None:
        if worker.is_cancelled:
            raise Superseded()
        post(FitProgressed(stage, done, total))

    return report


def load_engine(worker: JobThread, service: WritingService, lock: threading.Lock, post: Post) -> None:
    with lock:
        if worker.is_cancelled:  # the app quit before the model began to load
            return
        try:
            info = service.load()
        except Exception as exc:  # a broken model file is reported in the panels
            post(EngineFailed(describe(exc)))
            return
    post(EngineLoaded(info))


def generate(
    worker: JobThread,
    service: WritingService,
    lock: threading.Lock,
    post: Post,
    job: int,
    runs: tuple[Run, ...],
) -> None:
    def sink(targets: tuple[str, ...]) -> Callable[[str], None]:
        def stream(piece: str) -> None:
            if worker.is_cancelled:
                raise Superseded()
            if piece:  # an empty piece only asks whether the generation is still wanted
                post(GenerationPiece(job, targets, piece))

        return stream

    with lock:
        for run in runs:
            if worker.is_cancelled:
                return
            post(GenerationStarted(job, run.targets))
            try:
                result = service.rewrite(run.request, sink(run.targets))
            except Superseded:
                return
            except Exception as exc:
                # Only this run's panels fail: the other runs still run, so no panel stays "queued…".
                post(GenerationFailed(job, run.targets, describe(exc)))
                continue
            post(GenerationDone(job, run.targets, run.key, run.request, result))


def fit(worker: JobThread, service: WritingService, lock: threading.Lock, post: Post, user: User) -> None:
    with lock:
        try:
            if worker.is_cancelled:  # quitting, or a newer fit, while this one waited for the engine
                raise Superseded()
            report = service.fit(user, _progress(worker, post))
        except Superseded:
            post(FitDone(user.name, None, "cancelled", identity=user.identity))
            return
        except UserBusy as exc:
            post(FitDone(user.name, None, describe(exc), busy=True, identity=user.identity))
            return
        except Exception as exc:
            post(FitDone(user.name, None, describe(exc), identity=user.identity))
            return
    post(FitDone(user.name, report, identity=user.identity, kept=report.kept_without_history))


def prepare_demo(worker: JobThread, service: WritingService, lock: threading.Lock, post: Post) -> None:
    with lock:
        try:
            if worker.is_cancelled:
                raise Superseded()
            user = service.ensure_demo_user(_progress(worker, post))
        except Superseded:
            return
        except Exception as exc:
            post(DemoReady(None, describe(exc)))
            return
    post(DemoReady(user.name))
