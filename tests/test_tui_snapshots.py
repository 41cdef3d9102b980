"""SVG snapshots of the TUI's main screens on the fake engine (see tui_helpers for how to update them)."""

from __future__ import annotations

import pytest
from textual.pilot import Pilot
from textual.widgets import Input, TextArea
from tui_fakes import FakeService
from tui_helpers import assert_svg_snapshot, async_test, wait_idle

from localpers.tui.app import LocalpersApp
from localpers.users.history import HistoryItem
from localpers.users.store import UserStore

SIZE = (120, 36)
ARTICLE = (
    "Generate a headline for the following article: The city council voted 7-2 on Tuesday to turn three "
    "downtown parking lots into public parks, with construction set to begin next spring."
)
HISTORY = [
    (
        "A bakery now sells day-old bread at half price to cut food waste.",
        "Loaf Story Short: Half-Price Bread Sells Out",
    ),
    ("Library hours extend to Sundays at all 12 branches.", "Booked Solid: 12 Libraries Open On Sundays"),
    ("Youth turnout rose by a third in the primary.", "Youth Vote Comes Of Age: Turnout Up 33%"),
    (
        "A river cleanup pulled two tons of trash from the water.",
        "Current Events: 2 Tons Of Trash Out Of The River",
    ),
]


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fit times appear on the profile panel: make them the same on every run."""
    monkeypatch.setattr("localpers.users.folder.now", lambda: "2025-01-01T12:00:00+00:00")


def fitted_service() -> FakeService:
    store = UserStore()
    user = store.create("ann")
    user.save_history([HistoryItem.create("headline", i, o) for i, o in HISTORY])
    service = FakeService(store)
    service.fit(user, lambda *_: None)
    return service


async def still(pilot: Pilot[None]) -> None:
    """No blinking cursors, so the screenshot does not depend on timing."""
    await pilot.pause()
    for widget in pilot.app.screen.query("*"):
        if isinstance(widget, TextArea | Input):
            widget.cursor_blink = False
        if isinstance(widget, TextArea):
            # Textual 8.2's line cache keys the cursor only while it blinks, so a line drawn in a blink's "off"
            # phase would be reused without the cursor: drop the cache and draw afresh.
            widget._line_cache.clear()
            widget.refresh()
    await pilot.pause()


async def settled_screenshot(pilot: Pilot[None], attempts: int = 10) -> str:
    """The screen once two captures in a row agree (a late repaint must not decide the snapshot)."""
    await still(pilot)
    previous = pilot.app.export_screenshot()
    for _ in range(attempts):
        await pilot.pause(0.05)
        await still(pilot)
        current = pilot.app.export_screenshot()
        if current == previous:
            return current
        previous = current
    return previous


async def main_app_screenshot(keys: tuple[str, ...] = ()) -> str:
    app = LocalpersApp(fitted_service(), text=ARTICLE, debounce=0.05, refit_delay=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        if keys:
            await pilot.press(*keys)
            await wait_idle(pilot)
        return await settled_screenshot(pilot)


@async_test
async def test_snapshot_main_screen_with_why_view() -> None:
    assert_svg_snapshot(await main_app_screenshot(("f2", "right")), "main_why")


@async_test
async def test_snapshot_history_panel() -> None:
    assert_svg_snapshot(await main_app_screenshot(("f3",)), "history")


@async_test
async def test_snapshot_profile_panel() -> None:
    assert_svg_snapshot(await main_app_screenshot(("f4",)), "profile")


@async_test
async def test_snapshot_edit_and_accept_dialog() -> None:
    assert_svg_snapshot(await main_app_screenshot(("ctrl+g",)), "edit_accept")


@async_test
async def test_snapshot_first_run_welcome() -> None:
    app = LocalpersApp(FakeService(UserStore()), debounce=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        assert_svg_snapshot(await settled_screenshot(pilot), "welcome")
