"""Staging folders beside a device's users, so a user appears and disappears in one rename.

`localpers.users.store.UserStore` builds a new user (created or imported) in a hidden folder inside the users'
folder, `.creating-<pid>-<token>` or `.importing-...`, and renames it into place when it is whole; a delete renames
the user's folder to `.deleting-...` before removing its files. The users' folder and its staging folders share a
filesystem, so each rename is atomic. This module makes, commits and sweeps those folders and writes and removes
their files; which files a user has, and whether a name is free, is the store's business.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import sys
from pathlib import Path
from typing import Any

from localpers.atomic import fsync_directory, process_is_running
from localpers.errors import LocalpersError, StorageError

PURPOSES = ("creating", "importing", "deleting")
_HIDDEN_PURPOSES = tuple(f".{purpose}" for purpose in PURPOSES)  # how a staging folder's name begins


def not_a_folder(path: Path) -> str:
    """Why `path`, where a folder goes, is none, and the mend: a link to nothing (a drive not mounted?) is
    reconnected or removed, anything else moved away."""
    if path.is_symlink():
        return (
            f"{path} is a link to {os.readlink(path)}, which is not a folder (a drive not mounted?): reconnect what"
            " it points to, or remove the link"
        )
    return f"{path} is not a folder (a file is in its place): move it away"


def check_users_folder(users_dir: Path) -> None:
    """Refuse a file (or a link to nothing) where the users' folder goes: `user list` read "no users yet"
    and `user create` blamed permissions or disk space."""
    if os.path.lexists(users_dir) and not users_dir.is_dir():
        raise StorageError(f"{not_a_folder(users_dir)}; no user can be kept there until then")


def staging_dir(users_dir: Path, purpose: str, create: bool = True) -> Path:
    """A hidden folder for `purpose` (one of `PURPOSES`) inside `users_dir`, made (private) unless `create` is
    False; the users' folder is made first where missing, and leftovers of interrupted work are swept."""
    check_users_folder(users_dir)
    try:
        users_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # its names are users' names
        if users_dir.stat().st_mode & 0o077:  # made open by an earlier version
            with contextlib.suppress(OSError):
                users_dir.chmod(0o700)
        sweep(users_dir)
        path = users_dir / f".{purpose}-{os.getpid()}-{secrets.token_hex(6)}"
        if create:
            path.mkdir(mode=0o700)
    except OSError as exc:
        raise StorageError(
            f"cannot write in {users_dir} ({exc.strerror}); fix the folder's permissions or free some disk space"
        ) from None
    return path


def commit_staging(staging: Path, target: Path, name: str) -> None:
    """Rename the whole folder `staging` to `target`, user `name`'s folder, and flush the rename to disk."""
    try:
        os.rename(staging, target)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY) or os.path.lexists(target):  # made meanwhile
            raise LocalpersError(f"user {name!r} already exists; pick another name") from None
        raise StorageError(
            f"cannot put user {name!r} into {target.parent} ({exc.strerror or exc}); nothing was saved: free"
            " some disk space or fix the folder's permissions, then try again"
        ) from None
    fsync_directory(target.parent)


def sweep(users_dir: Path) -> None:
    """Remove folders left by an interrupted create, import or delete (not those of one still running)."""
    for leftover in users_dir.glob(".*-*"):
        purpose, _, rest = leftover.name.partition("-")
        if not leftover.is_dir() or purpose not in _HIDDEN_PURPOSES:
            continue
        pid = rest.split("-")[0]
        if pid.isdigit() and process_is_running(int(pid)):
            continue
        if leftover.is_symlink():  # left by an older delete of a linked user: the link, never its target
            with contextlib.suppress(OSError):
                leftover.unlink()
            continue
        shutil.rmtree(leftover, ignore_errors=True)


def remove_tree(path: Path) -> list[str]:
    """Delete the folder `path` with all it holds; what could not be deleted, as "FULL PATH: reason" lines."""
    failures: list[str] = []

    def note(_function: Any, failed: str, error: Any) -> None:
        reason = (
            error[1] if isinstance(error, tuple) else error
        )  # onerror passes exc_info, onexc the exception
        failures.append(f"{failed}: {getattr(reason, 'strerror', None) or reason}")

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=note)
    else:
        shutil.rmtree(path, onerror=note)
    return failures


def write_synced(path: Path, data: bytes) -> None:
    """Write a new file of a staging folder and flush it to disk: a crash after the folder's rename must not
    leave an imported user with an empty history (which reads as none, without an error)."""
    with path.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
