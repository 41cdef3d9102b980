"""The TUI's own settings, kept between runs: the theme chosen in the command palette (ctrl+p, "Theme").

They live in `tui.json` in the config folder (`localpers.paths.config_dir`), written atomically, and hold no
user text. Reading never fails: a missing file means the defaults, and a damaged one the defaults with a
one-line problem that the app shows as a notice (the next change replaces the file). This module neither knows
which themes exist (the app checks the saved name against Textual's) nor imports Textual.
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
    """The saved settings; the defaults, with a problem naming the file, when it cannot be used."""
    path = settings_path()
    if not path.exists() and not path.is_symlink():
        return SavedSettings()
    ignored = "the TUI starts with its default theme and replaces the file when you choose one"
    try:
        value = parse_json(read_regular_file(path, SETTINGS_LIMIT, what="TUI settings", stored=True))
    except (LocalpersError, JSONProblem) as exc:
        return SavedSettings(problem=f"{path} is not usable ({one_line(str(exc), limit=160)}); {ignored}")
    theme = value.get("theme") if isinstance(value, dict) else None
    if isinstance(value, dict) and (theme is None or isinstance(theme, str)):
        return SavedSettings(theme=theme)
    return SavedSettings(problem=f'{path} is damaged (expected {{"theme": "<name>"}}); {ignored}')


def save_theme(name: str) -> str | None:
    """Remember `name` as the theme; a one-line problem (None when saved) that the app shows as a notice."""
    try:
        path = settings_path()
        atomic_write_text(path, json.dumps({"theme": name}, indent=2) + "\n")
    except LocalpersError as exc:
        return f"the theme is not saved for the next run: {one_line(str(exc), limit=200)}"
    return None
