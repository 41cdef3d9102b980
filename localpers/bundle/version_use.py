"""Which installed bundle versions a running localpers still reads, so that `pull` does not delete them.

A process that opens the pulled bundle (`open_bundle`) takes a shared advisory lock on `versions/<id>.in-use` and
holds it until it exits: an API server or a TUI left running reads its centroids and adapters later (a CoPe fit,
a user switched to a cluster not loaded yet), and two pulls meanwhile deleted them under it. `pull` prunes a
version only when it can take that lock exclusively; a version in use stays until a later pull finds it free.
Where `fcntl` does not exist (Windows) nothing is held and every old version is pruned, as before. This module
reads and deletes nothing itself.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import IO

from localpers.regular_files import open_lock_file

IN_USE_SUFFIX = ".in-use"

_held: dict[str, IO[bytes]] = {}  # version folder -> the open lock file this process holds


def in_use_path(version_dir: Path) -> Path:
    """`versions/<id>.in-use` for the installed version `versions/<id>`."""
    return version_dir.with_name(version_dir.name + IN_USE_SUFFIX)


def hold_version(version_dir: Path) -> None:
    """Mark `version_dir` as read by this process until it exits (once per version; silently not where the
    lock file cannot be made: a read-only cache)."""
    key = str(version_dir)
    if key in _held:
        return
    try:
        import fcntl

        handle = open_lock_file(in_use_path(version_dir))
    except (ImportError, OSError):  # a FIFO there too: not held, never waited on
        return
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:  # a pull is deleting it this instant: nothing to hold
        handle.close()
        return
    _held[key] = handle


def is_in_use(version_dir: Path) -> bool:
    """Whether a running localpers holds `version_dir` (`hold_version`)."""
    path = in_use_path(version_dir)
    if not path.exists():
        return False
    try:
        import fcntl
    except ImportError:
        return False
    try:
        handle = open_lock_file(path)
    except OSError:
        return False
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        with contextlib.suppress(OSError):
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    return False


def release_versions() -> None:
    """Let go of every version this process holds (a test's home is thrown away after it)."""
    while _held:
        _, handle = _held.popitem()
        with contextlib.suppress(OSError):
            handle.close()
