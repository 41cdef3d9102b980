"""One publish at a time per stage cache, one install at a time per bundle folder (POSIX advisory locks).

Two publishes on one `--work` (also what two publishes into one `--out` share by default: `--work` is OUT/.work)
wiped and refilled each other's stage folders: one resumed from the other's checkpoints, installed the other's
manifest, exited 0 and left a cache later runs trusted. A publish holds a lock on the `--work` folder from start
to end, and a second one is refused at once. Installs into one OUT from different `--work`s wait for each other on
a lock on the OUT folder: an install sweeps the folders a killed install left, and without the lock it swept a
live one. The folders themselves are locked (neither is ever replaced, only what is in them), so no lock file
appears in a bundle. A lock goes with its process, however it ends. Where `fcntl` does not exist (Windows), or a
file system cannot lock a folder (some network mounts), nothing is locked. This module knows nothing of what the
folders hold.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from localpers.errors import LocalpersError


@contextlib.contextmanager
def locked(folder: Path, *, wait: bool, busy: str) -> Iterator[None]:
    """Hold an exclusive lock on the existing `folder` for the block; when another process holds it, wait for it
    (`wait`) or raise `busy` as a one-line error."""
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
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        except OSError as exc:
            if exc.errno not in (errno.EBADF, errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP):
                raise
        yield
    finally:
        os.close(descriptor)  # releases the lock
