"""Helpers for the TUI tests: waiting for the app to go idle, and SVG snapshot comparison.

Snapshots live in tests/snapshots/tui/*.svg, recorded with the Textual version in TEXTUAL_VERSION.
On that version the SVG must match exactly; on another one (whose SVG markup may differ) the visible
text must match. `LOCALPERS_UPDATE_SNAPSHOTS=1 pytest tests/test_tui_snapshots.py` rewrites them:
review the SVGs (open them in a browser) before committing.
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import html
import os
import re
import tempfile
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import textual
from textual.pilot import Pilot
from tui_fakes import FakeService

from localpers.tui.app import LocalpersApp
from localpers.tui.job_threads import THREAD_PREFIX
from localpers.users.history import HistoryItem
from localpers.users.store import UserStore

SNAPSHOT_DIR = Path(__file__).parent / "snapshots" / "tui"
VERSION_FILE = SNAPSHOT_DIR / "TEXTUAL_VERSION"
UPDATE_ENV = "LOCALPERS_UPDATE_SNAPSHOTS"
_TEXT_ELEMENT = re.compile(r"<text[^>]*>(.*?)</text>", re.S)
_TEXT_Y = re.compile(r'<text[^>]*\by="([0-9.]+)"[^>]*>(.*?)</text>', re.S)

SIZE = (120, 40)  # the terminal the Pilot tests run in
DRAFT = "The city opened a new bike lane along the river"


def examples(prefix: str, count: int) -> list[HistoryItem]:
    """`count` headline items whose outputs name `prefix`, for a user's history."""
    return [
        HistoryItem.create(
            "headline", f"{prefix} article number {i} about the town", f"{prefix.upper()} {i}!"
        )
        for i in range(count)
    ]


def one_user_service() -> FakeService:
    """A fake engine over a store with one user, ann (4 items), active and not yet fitted."""
    store = UserStore()
    store.create("ann").save_history(examples("ann", 4))
    store.use("ann")
    return FakeService(store)


def make_app(service: Any, **kwargs: object) -> LocalpersApp:
    """The app over `service`, with short debounce and refit delays for tests."""
    return LocalpersApp(service, debounce=0.05, refit_delay=0.05, **kwargs)  # type: ignore[arg-type]


def async_test(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test function with asyncio.run (no pytest async plugin needed)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            asyncio.run(test(*args, **kwargs))
        finally:
            join_job_threads()

    return run


def join_job_threads(timeout: float = 120.0) -> None:
    """Wait for the engine jobs a test's app left running (quitting does not wait for them): the next test
    must not share an engine with one."""
    for thread in threading.enumerate():
        if thread.name.startswith(THREAD_PREFIX):
            thread.join(timeout)
            assert not thread.is_alive(), f"{thread.name} still runs after {timeout} s"


async def wait_idle(pilot: Pilot[None], timeout: float = 30.0) -> None:
    """Wait until no generation or fit is pending or running, and their messages are handled."""
    app = pilot.app
    assert isinstance(app, LocalpersApp)
    waited = 0.0
    quiet_rounds = 0
    while quiet_rounds < 2:
        await pilot.pause(0.05)
        waited += 0.05
        if waited > timeout:
            raise AssertionError(f"the app stayed busy for more than {timeout} s")
        quiet_rounds = 0 if app.busy else quiet_rounds + 1
    await pilot.pause()


def visible_lines(svg: str) -> list[str]:
    """The screen's text, one line per row (rows joined from the SVG's text elements by y)."""
    rows: dict[float, list[str]] = {}
    for y, content in _TEXT_Y.findall(svg):
        rows.setdefault(float(y), []).append(html.unescape(re.sub(r"<[^>]+>", "", content)))
    return ["".join(parts).replace("\xa0", " ").rstrip() for _, parts in sorted(rows.items())]


def assert_svg_snapshot(svg: str, name: str) -> None:
    path = SNAPSHOT_DIR / f"{name}.svg"
    if os.environ.get(UPDATE_ENV) == "1":
        SNAPSHOT_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(svg, encoding="utf-8")
        VERSION_FILE.write_text(textual.__version__ + "\n", encoding="utf-8")
        return
    if not path.exists():
        pytest.fail(f"no snapshot {path}: run with {UPDATE_ENV}=1 to record it, then review it")
    expected = path.read_text(encoding="utf-8")
    recorded_version = VERSION_FILE.read_text().strip() if VERSION_FILE.exists() else None
    same_version = recorded_version == textual.__version__
    if (svg == expected) if same_version else (visible_lines(svg) == visible_lines(expected)):
        return
    out_dir = Path(tempfile.gettempdir()) / "localpers-snapshots"
    out_dir.mkdir(exist_ok=True)
    actual = out_dir / f"{name}.svg"
    actual.write_text(svg, encoding="utf-8")
    diff = "\n".join(
        difflib.unified_diff(visible_lines(expected), visible_lines(svg), "snapshot", "now", lineterm="")
    )
    what = "SVG" if same_version else f"visible text (snapshot from Textual {recorded_version})"
    pytest.fail(f"{what} differs from {path}; this run's screen is in {actual}\n{diff or '(colours only)'}")
