"""One signing command at a time per repository: `repo init`, `add`, `add-backbone`, `refresh` and `rotate` each
hold an exclusive advisory lock on the repository's `.repo.lock` while they read and re-sign its metadata.

Without it a `repo refresh` (a cron job) running beside a `repo add` signed a timestamp naming one snapshot
version with the hash of another, both commands exited 0, and every new device refused the repository. A second
command waits for the first (its lock goes with its process, however it ends). The file is hidden, so `repo init`
accepts a folder holding it, and `serve` never serves it (only TUF metadata and hash-named targets). Where `fcntl`
does not exist (Windows) nothing is locked. This module signs and writes nothing else.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from localpers.errors import LocalpersError

LOCK_NAME = ".repo.lock"


@contextlib.contextmanager
def repository_lock(directory: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold `directory`'s repository lock for the block, waiting for another command's; `on_wait` is called once
    if it has to wait."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    path = Path(directory) / LOCK_NAME
    try:
        # never through a link: one at the lock's name made the command create the file it pointed to, anywhere
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LocalpersError(
                f"{path} is a link; the repository's lock must be a file of its own: remove the link"
            ) from None
        raise LocalpersError(f"{directory}: cannot lock the repository ({exc.strerror})") from None
    handle = os.fdopen(descriptor, "a")
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
