"""Reading one file whole, safely: a regular file of bounded size, never a FIFO, device or socket.

`read_regular_file` (over `open_regular_file`, which `sha256_of_file` uses too) is what every reader of a history file, a user archive, a user's stored history or an
engine state kept in a user's folder (`localpers.engine.prefix_files`) goes through. It only reads bytes;
parsing them is the caller's job. `open_lock_file` opens a lock file the same way: never a FIFO or device, never
blocking.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO

from localpers.errors import InputError, LocalpersError

# What a small JSON or token file localpers keeps (state, pointers, caches, config) may weigh: far above any real
# one, far below what would exhaust memory (a link to /dev/zero, or a file grown by hand, is refused first).
STATE_FILE_LIMIT = 64 << 20


def read_regular_file(
    path: Path,
    limit: int,
    *,
    what: str,
    stored: bool = False,
    follow_links: bool = True,
    too_big: str | None = None,
) -> bytes:
    """The bytes of `path`, refusing anything but a regular file of at most `limit` bytes.

    With `follow_links=False` a symbolic link is refused too, even to a regular file (a cache that must be
    the folder's own file, not one linked in from elsewhere).

    A FIFO, device or socket is refused without being opened for reading (reading one blocks or never
    ends); the file is opened with O_NONBLOCK so a FIFO swapped in after the check cannot block either.
    `too_big`: what to do about a file over the limit (default: split a file passed in, move a stored one away).
    Every refusal of a file passed in from outside exits 2 (a bad argument); for a file localpers
    keeps (`stored`), one it cannot open or that is not a file exits 1 and only an oversized one 2.
    """
    unusable: type[LocalpersError] = LocalpersError if stored else InputError
    fix = "move it away" if stored else f"pass a {what}"
    # localpers never writes a file over its limit: one grew by hand (files joined, a link to something else)
    too_big = too_big or (
        "localpers never writes one so large (joined or edited by hand?): move it away"
        if stored
        else "split it"
    )
    try:
        info = path.stat() if follow_links else path.lstat()
    except FileNotFoundError:
        raise unusable(f"{path}: no such file") from None
    except OSError as exc:
        raise unusable(f"{path}: cannot read ({exc.strerror})") from None
    if stat.S_ISLNK(info.st_mode):
        raise unusable(f"{path} is a link; {fix}")
    if stat.S_ISDIR(info.st_mode):
        raise unusable(f"{path} is a directory; {fix}")
    if not stat.S_ISREG(info.st_mode):
        raise unusable(f"{path} is not a regular file (a FIFO, device or socket); {fix}")
    if info.st_size > limit:
        raise InputError(
            f"{path} is {info.st_size:,} bytes, more than the {limit:,} a {what} may have; {too_big}"
        )
    try:
        with open_regular_file(path, follow_links=follow_links) as handle:
            raw = handle.read(limit + 1)
    except NotRegularFile:
        raise unusable(f"{path} is not a regular file; {fix}") from None
    except PermissionError as exc:
        raise unusable(f"{path}: cannot read ({exc.strerror}); give your account read access to it") from None
    except OSError as exc:
        raise unusable(f"{path}: cannot read ({exc.strerror})") from None
    if len(raw) > limit:
        raise InputError(f"{path} is more than the {limit:,} bytes a {what} may have; {too_big}")
    return raw


class NotRegularFile(OSError):
    """What `open_regular_file` opened is a FIFO, device, socket or folder (EINVAL)."""


def open_regular_file(path: Path, *, follow_links: bool = True) -> IO[bytes]:
    """`path` opened for binary reading without blocking; `NotRegularFile` (an OSError) where it is no regular file.

    O_NONBLOCK: a FIFO (swapped in after a caller's check) is never waited on for a writer. O_BINARY: on Windows a
    descriptor opened without it reads as text (CRLF -> LF, stops at 0x1A). `follow_links=False` refuses a link.
    """
    no_follow = 0 if follow_links else getattr(os, "O_NOFOLLOW", 0)
    descriptor = os.open(
        path, os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0) | no_follow
    )
    handle = os.fdopen(descriptor, "rb")
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        handle.close()
        raise NotRegularFile(errno.EINVAL, "not a regular file (a FIFO, device, socket or folder)", str(path))
    return handle


def open_lock_file(path: Path) -> IO[bytes]:
    """`path` opened for appending (created if missing), to take an advisory lock on; an OSError where it is not
    a regular file of its own (a FIFO, device, socket, folder or link). Opened blocking, a FIFO waited for a
    reader forever."""
    not_regular = OSError(
        errno.EINVAL, "not a regular file (a FIFO, device, socket, folder or link)", str(path)
    )
    with_flags = (
        os.O_WRONLY
        | os.O_CREAT
        | os.O_APPEND
        | getattr(os, "O_BINARY", 0)
        | getattr(os, "O_NONBLOCK", 0)
        | getattr(os, "O_NOFOLLOW", 0)
    )
    try:
        if not stat.S_ISREG(path.lstat().st_mode):
            raise not_regular
    except FileNotFoundError:
        pass
    descriptor = os.open(path, with_flags, 0o666)
    handle = os.fdopen(descriptor, "ab")
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        handle.close()
        raise not_regular
    return handle
