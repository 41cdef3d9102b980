"""The theme chosen in the TUI's command palette is kept for the next run (it was forgotten at every start)."""

from __future__ import annotations

from pathlib import Path

import pytest
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
        unknown = [notice for notice in app._notifications if "no-such-theme" in str(notice.message)]
        assert len(unknown) == 1 and unknown[0].severity == "warning"


def test_a_settings_file_that_cannot_be_written_is_a_problem_not_a_crash() -> None:
    _settings_file().mkdir(parents=True)  # a folder where the file should be
    problem = save_theme("textual-light")
    assert problem is not None and problem.startswith("the theme is not saved for the next run")
    loaded = load_settings().problem
    assert loaded is not None and loaded.endswith(
        "is not a file; remove it for the TUI to keep its theme between runs"
    )


def test_a_linked_settings_file_stays_a_link(tmp_path: Path) -> None:
    """A dotfiles manager's link was replaced by a plain file at the first theme change."""
    kept = tmp_path / "dotfiles" / "tui.json"
    kept.parent.mkdir()
    kept.write_text('{"theme": "textual-dark"}', encoding="utf-8")
    _settings_file().symlink_to(kept)
    assert load_settings().theme == "textual-dark"
    assert save_theme("textual-light") is None
    assert _settings_file().is_symlink() and load_settings().theme == "textual-light"
    _settings_file().unlink()
    _settings_file().symlink_to(kept.parent / "not-made-yet.json")  # saving makes the file it names
    assert load_settings() == load_settings().__class__()  # no problem to report
    assert save_theme("textual-dark") is None and load_settings().theme == "textual-dark"


def test_a_config_folder_that_cannot_be_made_is_a_problem_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review found `load_settings` raised where the config folder could not be made: a traceback at start."""
    blocker = tmp_path / "a-file"
    blocker.write_text("", encoding="utf-8")
    monkeypatch.setenv("LOCALPERS_HOME", str(blocker / "home"))
    problem = load_settings().problem
    assert problem is not None and "default theme" in problem and "\n" not in problem
    assert save_theme("textual-light") is not None
