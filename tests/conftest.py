"""Shared test fixtures: every test gets its own empty localpers home."""

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def localpers_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point LOCALPERS_HOME at a temp dir so no test reads or writes the real user folders."""
    home = tmp_path / "localpers-home"
    monkeypatch.setenv("LOCALPERS_HOME", str(home))
    return home
