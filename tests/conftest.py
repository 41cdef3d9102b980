"""Shared fixtures: an isolated LOCALPERS_HOME for every test, and one backbone engine per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from localpers.backbone import Backbone, resolve_backbone

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "news-headlines"


@pytest.fixture(autouse=True)
def isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own data/config dirs; the backbone cache stays shared so it is assembled once."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("LOCALPERS_HOME", str(home))
    monkeypatch.delenv("LOCALPERS_MODEL", raising=False)
    return home


@pytest.fixture(scope="session")
def backbone() -> Backbone:
    """The embedded default backbone, resolved with the real (shared) cache directory."""
    return resolve_backbone()
