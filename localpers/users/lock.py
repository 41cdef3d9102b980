"""One writer at a time per user folder: an advisory lock around each read-modify-write of a user's files.

Every file write is atomic (`localpers.atomic`), but a change such as "add this item to the history" reads
the history, adds to it and writes it back. Two such changes at once (the TUI accepting a headline while
`localpers history import` runs, or a script adding items in parallel) would each write the history they
read, and the last rename would drop the other's items. `user_lock(folder)` serialises them: it holds an
exclusive `flock` on `<folder>/.lock` (POSIX; other processes wait) and a per-folder re-entrant thread lock
(other threads of this process wait; the same thread may nest, so a locked change can call a method that
locks again). A waiter gives up with a one-line error after `wait_seconds`.

When the folder is renamed away while a caller waits (the user was deleted, which takes the same lock), the
caller gets a one-line error instead of writing into a folder that is about to be removed. A user deleted and
created again under the same name while a long command (a fit) ran is a new folder at the same path: each
folder holds a random `.identity` token, and a caller that read it when it started (`identity=`) is refused
when the folder's token differs, instead of writing the old user's fit into the new one. Readers do not
wait for the lock: they see the old file or the new one (one that writes a cache of what it read takes the lock
only if it is free, `wait_seconds=0`). A fit, which runs for seconds to minutes, also holds the folder's
`.fit.lock` from start to end (`fit_lock`), so a second fit of the same user is refused at once instead of doing
the same work beside it. Taking a folder's lock also removes the temp files writers that died left in it
(`atomic.remove_stale_temp_files_in`). This module knows nothing else of what is in the folder.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from localpers.atomic import remove_stale_temp_files_in
from localpers.errors import LocalpersError, UserBusy
from localpers.regular_files import read_regular_file

LOCK_FILE = ".lock"
FIT_LOCK_FILE = ".fit.lock"  # held for a whole fit (`fit_lock`), beside the write lock
IDENTITY_FILE = ".identity"
_IDENTITY = re.compile(r"[0-9a-f]{32}")
DEFAULT_WAIT_SECONDS = 60.0
_POLL_SECONDS = 0.05

_registry_guard = threading.Lock()
_thread_locks: dict[str, threading.RLock] = {}
# Per folder, while its thread lock is held: how deep the holder has nested, and the locked file's descriptor.
_depth: dict[str, int] = {}
_descriptors: dict[str, int | None] = {}


def _forget_held_locks() -> None:
    """In a forked child: the parent's holds are not the child's (the child must take the lock itself)."""
    global _registry_guard
    _registry_guard = threading.Lock()
    _thread_locks.clear()
    _depth.clear()
    # The child's copies of the locked descriptors would keep the parent's lock alive after the parent
    # releases it (a flock lasts while any copy is open); closing them leaves the parent's lock held.
    for descriptor in _descriptors.values():
        if descriptor is not None:
            with contextlib.suppress(OSError):
                os.close(descriptor)
    _descriptors.clear()


os.register_at_fork(after_in_child=_forget_held_locks)


IDENTITY_FILE_LIMIT = 1024  # a 32-character token; a FIFO or /dev/zero in its place is refused, not read


def read_identity(folder: Path) -> str | None:
    """The folder's identity token; None when it has none (a folder made before tokens) or it is unreadable."""
    try:
        raw = read_regular_file(folder / IDENTITY_FILE, IDENTITY_FILE_LIMIT, what="identity", stored=True)
        token = raw.decode("ascii").strip()
    except (LocalpersError, UnicodeDecodeError):
        return None
    return token if _IDENTITY.fullmatch(token) else None


def new_identity() -> str:
    """A fresh identity token, for a folder about to be made (written by the caller, atomically)."""
    return secrets.token_hex(16)


def _thread_lock(key: str) -> threading.RLock:
    with _registry_guard:
        return _thread_locks.setdefault(key, threading.RLock())


@contextlib.contextmanager
def user_lock(
    folder: Path, *, who: str, wait_seconds: float = DEFAULT_WAIT_SECONDS, identity: str | None = None
) -> Iterator[None]:
    """Hold `folder`'s write lock for the block; `who` names the user in errors (e.g. "user 'ann'").

    With `identity`, the folder must still hold that token once locked (else: deleted while this ran).
    """
    key = os.path.realpath(folder)  # one key however the folder is reached (a symlinked data dir)
    guard = _thread_lock(key)
    if not guard.acquire(timeout=wait_seconds):
        raise _busy(folder, who)
    try:
        if _depth.get(key, 0) == 0:
            _descriptors[key] = _lock_file(Path(key), who, wait_seconds)
            if identity is not None and read_identity(Path(key)) != identity:
                _release(_descriptors.pop(key))
                raise _gone(who)
            # the folder is ours and locked: what a killed writer left here goes (its private bytes too)
            remove_stale_temp_files_in(Path(key))
        _depth[key] = _depth.get(key, 0) + 1
        try:
            yield
        finally:
            _depth[key] -= 1
            if _depth[key] == 0:
                _release(_descriptors.pop(key))
                del _depth[key]
    finally:
        guard.release()


@contextlib.contextmanager
def fit_lock(folder: Path, *, who: str, wait_seconds: float = 0.0) -> Iterator[None]:
    """Hold `folder`'s fit lock for the block: one fit of a user at a time (by default a second is refused).

    A fit takes seconds to minutes and saves through the write lock as it goes; two of one user would do the
    same work twice and the last to finish would win. Not re-entrant: take it once, around the whole fit.
    """
    descriptor = _lock_file(folder, who, wait_seconds, name=FIT_LOCK_FILE, busy=_fitting)
    try:
        yield
    finally:
        _release(descriptor)


def _lock_file(
    folder: Path,
    who: str,
    wait_seconds: float,
    *,
    name: str = LOCK_FILE,
    busy: Callable[[Path, str], LocalpersError] | None = None,
) -> int | None:
    """The descriptor of `folder`'s lock file `name`, exclusively locked; None where fcntl does not exist."""
    try:
        import fcntl
    except ImportError:  # Windows: the thread lock alone
        return None
    busy = busy or _busy
    path = folder / name
    try:
        # O_NOFOLLOW: a link at the lock's name (even a dangling one) is refused, never followed to create
        # or lock a file outside the user's folder.
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except (FileNotFoundError, NotADirectoryError):
        raise _gone(who) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LocalpersError(
                f"{path} is a symbolic link; localpers does not follow links for a user's lock file: remove"
                " the link"
            ) from None
        if exc.errno == errno.EROFS:
            raise LocalpersError(
                f"{path}: cannot create the user's lock file, the file system is read-only; localpers writes"
                " to the user's folder: mount it writable or set LOCALPERS_HOME to a writable folder"
            ) from None
        raise LocalpersError(
            f"{path}: cannot open the user's lock file ({exc.strerror}); localpers needs to create and write it "
            "there: move away whatever has its name, or give your account write access to the folder"
        ) from None
    deadline = time.monotonic() + wait_seconds
    try:
        while True:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise busy(folder, who) from None
                time.sleep(_POLL_SECONDS)
        if not _same_file(descriptor, path):
            raise _gone(who)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def _same_file(descriptor: int, path: Path) -> bool:
    """Whether `path` still names the file we locked (a deleted user's folder was renamed away)."""
    try:
        on_disk = os.stat(path)
    except OSError:
        return False
    held = os.fstat(descriptor)
    return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def _release(descriptor: int | None) -> None:
    if descriptor is not None:
        os.close(descriptor)  # closing the only descriptor of the open file releases its flock


def _busy(folder: Path, who: str) -> UserBusy:
    return UserBusy(
        f"{who} is busy: another localpers command is changing it ({folder / LOCK_FILE} is locked); "
        "try again when it has finished"
    )


def _fitting(folder: Path, who: str) -> UserBusy:
    return UserBusy(
        f"{who} is being fitted by another localpers command ({folder / FIT_LOCK_FILE} is locked); "
        "wait for that fit to finish, or stop it, then fit again"
    )


def _gone(who: str) -> LocalpersError:
    return LocalpersError(
        f"{who} no longer exists (deleted, or deleted and created anew, while this command ran); nothing was written"
    )
