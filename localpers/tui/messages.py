"""Messages that worker threads post to the app (posting a message is thread-safe in Textual).

Each generation message carries the job id it belongs to, so the app can drop pieces of a job that a
newer one superseded. Nothing here does work; see `localpers.tui.app` for who posts and handles what.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.message import Message

from localpers.tui.service import EngineInfo, RewriteRequest

if TYPE_CHECKING:
    from localpers.methods.reports import FitReport, RewriteResult

Targets = tuple[str, ...]  # output panels a run feeds: "baseline", "personal" or both


@dataclass
class EngineLoaded(Message):
    info: EngineInfo


@dataclass
class EngineFailed(Message):
    error: str


@dataclass
class GenerationStarted(Message):
    job: int
    targets: Targets


@dataclass
class GenerationPiece(Message):
    job: int
    targets: Targets
    piece: str


@dataclass
class GenerationDone(Message):
    job: int
    targets: Targets
    key: tuple[object, ...]
    request: RewriteRequest
    result: RewriteResult


@dataclass
class GenerationFailed(Message):
    job: int
    targets: Targets
    error: str


@dataclass
class FitProgressed(Message):
    stage: str
    done: int
    total: int


@dataclass
class FitDone(Message):
    user: str
    report: FitReport | None
    error: str | None = None
    busy: bool = False  # another localpers command held the user (a fit in a shell): try again later
    identity: str | None = None  # the fitted user folder's identity token (a user made anew has another)
    kept: bool = False  # no items to fit: the fit a user imported without its history came with was kept


@dataclass
class DemoReady(Message):
    user: str | None
    error: str | None = None


@dataclass
class JobCrashed(Message):
    """An engine job let an exception through (a defect: its engine errors come as the messages above)."""

    description: str
