"""A test helper: the order in which a write syncs and renames its files."""

from __future__ import annotations

import os

import pytest


def record_fsyncs_and_renames(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A list that "fsync" and "replace" are appended to as `os.fsync` and `os.replace` run (they still run)."""
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda *paths: (events.append("replace"), real_replace(*paths))[1])
    return events
