"""The TUI's own settings, kept between runs: the theme chosen in the command palette (ctrl+p, "Theme").

They live in `tui.json` in the config folder (`localpers.paths.config_dir`), written atomically, and hold no
user text. Reading never fails: a missing file means the defaults, and an unusable one the defaults with a
one-line problem that the app shows as a notice (choosing another theme replaces a damaged file). This module
does not know which themes exist: the app checks the saved name against Textual's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from localpers.atomic import atomic_write_text
from localpers.errors import LocalpersError
from localpers.paths import config_dir
from localpers.regular_files import read_regular_file
from localpers.untrusted import JSONProblem, one_line, parse_json

SETTINGS_FILE = "tui.json"
SETTINGS_LIMIT = 64 << 10  # a few names; anything larger is not ours


@dataclass(frozen=True)
class SavedSettings:
    """What the last run left: a theme name (None: Textual's default), and why the file was not read, if so."""

    theme: str | None = None
    problem: str | None = None


def settings_path() -> Path:
    return config_dir() / SETTINGS_FILE


def load_settings() -> SavedSettings:
    """The saved settings; the defaults, with a one-line problem naming the file, when they cannot be used."""
    try:
        return _read_settings()
    except (LocalpersError, OSError) as exc:  # the config folder cannot be made, or searched
        reason = one_line(str(exc), limit=200)
        return SavedSettings(
            problem=f"the TUI's settings cannot be read ({reason}); it starts with its default theme"
        )


def _read_settings() -> SavedSettings:
    path = settings_path()
    if not path.is_symlink() and not path.exists():
        return SavedSettings()
    if path.is_symlink() and not path.exists() and (path.parent / path.readlink()).parent.is_dir():
        return SavedSettings()  # a link to a file not made yet: saving writes through it
    if not path.is_file():  # a folder, a FIFO, a link to nothing: saving would be refused too
        return SavedSettings(
            problem=f"{path} is not a file; remove it for the TUI to keep its theme between runs"
        )
    replaced = "the TUI starts with its default theme; choosing another (ctrl+p, Theme) replaces the file"
    try:
        data = read_regular_file(path, SETTINGS_LIMIT, what="TUI settings", stored=True)
    except LocalpersError as exc:  # it names the file
        return SavedSettings(
            problem=f"{one_line(str(exc), limit=200)}; the TUI starts with its default theme"
        )
    try:
        value = parse_json(data)
    except JSONProblem as exc:
        return SavedSettings(problem=f"{path} is not valid JSON ({exc}); {replaced}")
    theme = value.get("theme") if isinstance(value, dict) else None
    if isinstance(value, dict) and (theme is None or isinstance(theme, str)):
        return SavedSettings(theme=theme)
    return SavedSettings(problem=f'{path} is damaged (expected {{"theme": "<name>"}}); {replaced}')


def save_theme(name: str) -> str | None:
    """Remember `name` as the theme; a one-line problem (None when saved) that the app shows as a notice.

    A `tui.json` that is a symbolic link (a dotfiles manager's) keeps being one: the file it points to is
    replaced."""
    try:
        path = settings_path()
        target = path.resolve() if path.is_symlink() else path
        atomic_write_text(target, json.dumps({"theme": name}, indent=2) + "\n")
    except (LocalpersError, OSError, RuntimeError) as exc:  # RuntimeError: a loop of links
        return f"the theme is not saved for the next run: {one_line(str(exc), limit=200)}"
    return None
