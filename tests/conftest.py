"""Shared fixtures: an isolated LOCALPERS_HOME for every test, and the backbone resolved once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from localpers.backbone import Backbone, resolve_backbone

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "news-headlines"


@pytest.fixture(autouse=True)
def localpers_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point LOCALPERS_HOME at a temp dir so no test reads or writes the real user folders."""
    home = tmp_path / "localpers-home"
    monkeypatch.setenv("LOCALPERS_HOME", str(home))
    monkeypatch.delenv("LOCALPERS_MODEL", raising=False)
    return home


@pytest.fixture(scope="session")
def backbone() -> Backbone:
    """The embedded default backbone, resolved with the real cache so it is assembled only once."""
    return resolve_backbone()
