"""An exclusive advisory lock on a folder, for commands that must not run twice on one folder at once.

`localpers publish` holds its `--work` folder's for a whole run (two publishes on one stage cache wiped and
refilled each other's stages, one installing the other's manifest with exit 0) and its `--out` folder's around an
install (an install sweeps what a killed install left, and without the lock it swept a running one's);
`localpers bench` holds its `--out` folder's for a whole run (two runs deleted each other's staging folder). The
folder itself is locked (none of these is ever replaced, only what is in it), so no lock file appears in a
bundle or a run's folder. A lock goes with its process, however it ends. Where `fcntl` does not exist (Windows),
or a file system cannot lock a folder (some network mounts), nothing is locked. This module knows nothing of
what the folders hold.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from localpers.errors import LocalpersError


@contextlib.contextmanager
def locked(
    folder: Path, *, wait: bool, busy: str, on_wait: Callable[[], None] | None = None
) -> Iterator[None]:
    """Hold an exclusive lock on the existing `folder` for the block; when another process holds it, wait for it
    (`wait`, calling `on_wait` first: say so) or raise `busy` as a one-line error."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    try:
        descriptor = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise LocalpersError(f"{folder}: cannot open the folder to lock it ({exc.strerror})") from None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                raise LocalpersError(busy) from None
            if on_wait is not None:
                on_wait()
            _lock_or_not(fcntl, descriptor, fcntl.LOCK_EX)
        except OSError as exc:
            _unlockable(exc)
        yield
    finally:
        os.close(descriptor)  # releases the lock


def _lock_or_not(fcntl: Any, descriptor: int, operation: int) -> None:
    try:
        fcntl.flock(descriptor, operation)
    except OSError as exc:
        _unlockable(exc)


def _unlockable(exc: OSError) -> None:
    """Go on unlocked where the file system cannot lock a folder; raise anything else."""
    if exc.errno not in (errno.EBADF, errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP):
        raise exc
