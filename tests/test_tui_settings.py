"""The theme chosen in the TUI's command palette is kept for the next run (it was forgotten at every start)."""

from __future__ import annotations

from pathlib import Path

from tui_fakes import FakeService
from tui_helpers import DRAFT, async_test, examples, make_app, wait_idle

from localpers.tui.settings import SETTINGS_FILE, load_settings, save_theme
from localpers.users.store import UserStore


def _service() -> FakeService:
    """A service over user ann (created on first call), as each app run starts one."""
    store = UserStore()
    if "ann" not in store.list():
        store.create("ann").save_history(examples("ann", 4))
        store.use("ann")
    return FakeService(store)


def _settings_file() -> Path:
    from localpers.paths import config_dir

    return config_dir() / SETTINGS_FILE


@async_test
async def test_a_chosen_theme_is_the_next_runs_theme() -> None:
    service = _service()
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_idle(pilot)
        assert app.theme == "textual-dark" and not _settings_file().exists()  # nothing written unasked
        app.theme = "textual-light"
        await pilot.pause(0.2)
    assert load_settings().theme == "textual-light"
    again = make_app(_service(), text=DRAFT)
    async with again.run_test(size=(120, 36)) as pilot:
        await wait_idle(pilot)
        assert again.theme == "textual-light"


@async_test
async def test_a_damaged_or_unknown_setting_starts_with_the_default_and_says_so() -> None:
    _settings_file().write_text('{"theme": ', encoding="utf-8")
    problem = load_settings().problem
    assert problem is not None and SETTINGS_FILE in problem and "default theme" in problem
    service = _service()
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_idle(pilot)
        assert app.theme == "textual-dark"
        assert any(SETTINGS_FILE in str(notice.message) for notice in app._notifications)
        app.theme = "textual-light"  # the next choice replaces the damaged file
        await pilot.pause(0.2)
    assert load_settings() == load_settings().__class__(theme="textual-light")
    _settings_file().write_text('{"theme": "no-such-theme"}', encoding="utf-8")
    app = make_app(_service(), text=DRAFT)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_idle(pilot)
        assert app.theme == "textual-dark"
        assert any("no-such-theme" in str(notice.message) for notice in app._notifications)


def test_a_settings_file_that_cannot_be_written_is_a_problem_not_a_crash() -> None:
    _settings_file().mkdir(parents=True)  # a folder where the file should be
    problem = save_theme("textual-light")
    assert problem is not None and problem.startswith("the theme is not saved for the next run")
    assert load_settings().problem is not None
