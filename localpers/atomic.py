"""Atomic file replacement: a reader sees the old file or the new one, never a half-written one.

`atomic_write_bytes` writes a temp file in the target's folder, fsyncs it, renames it over the
target and fsyncs the folder so the rename survives a crash. It refuses to replace anything but a
regular file (renaming over a device node such as /dev/null, a FIFO or a socket would destroy it).
Temp files carry the target's name and the writer's process id, and each write of a file removes that
file's temp files left by writers that no longer run (a killed import leaves no `.partial` behind for long).
Other files' temp files are removed only in a folder localpers owns (`remove_stale_temp_files_in`: a user's
folder, each time its lock is taken), never where the user chose to write (their own `.partial` files may be
there). It does not lock: two writers race and the last rename wins (a user's read-modify-writes hold
`localpers.users.lock` for that).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import tempfile
from pathlib import Path

from localpers.errors import LocalpersError, StorageError

TEMP_SUFFIX = ".partial"
TEMP_STEM_BYTES = 200  # of a target's name in its temp files: with pid, random part and suffix, under 255
ON_WINDOWS = os.name == "nt"


def process_is_running(pid: int) -> bool:
    """Whether a process with this id runs (ours or another user's). On Windows, where `os.kill(pid, 0)` would
    send a Ctrl-C event rather than check, every other process is taken as running (its leftovers are kept)."""
    if pid <= 0:
        return False
    if ON_WINDOWS:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # it exists but is another user's; or a number we cannot check: leave it
    return True


def remove_stale_temp_files(target: Path) -> list[Path]:
    """Delete the temp files of `target` (`.<name>.<pid>.<random>.partial` beside it) whose writing process is
    gone; returns what was deleted."""
    target = Path(target)
    return _remove_dead_writers_files(target.parent, re.escape(f".{_temp_stem(target.name)}."))


def _temp_stem(name: str) -> str:
    """`name` as its temp files start, cut to TEMP_STEM_BYTES: a legal name of 230-255 bytes made a temp name over
    the file system's 255 and every write of it failed."""
    while len(os.fsencode(name)) > TEMP_STEM_BYTES:
        name = name[:-1]
    return name


def remove_stale_temp_files_in(folder: Path) -> list[Path]:
    """Delete every temp file in `folder` whose writing process is gone, whatever file it was for: only for a
    folder localpers owns (a user's), where no one else names files `.X.<pid>.Y.partial`."""
    return _remove_dead_writers_files(Path(folder), r"\..+\.")


def _remove_dead_writers_files(folder: Path, name_pattern: str) -> list[Path]:
    # <name_pattern><pid>.<random>.partial
    temp_name = re.compile(name_pattern + r"(\d{1,10})\.[^.]+" + re.escape(TEMP_SUFFIX))
    removed: list[Path] = []
    try:
        candidates = list(folder.glob(f".*{TEMP_SUFFIX}"))
    except OSError:
        return removed
    for candidate in candidates:
        match = temp_name.fullmatch(candidate.name)
        if match and not process_is_running(int(match[1])):
            with contextlib.suppress(OSError):
                candidate.unlink()
                removed.append(candidate)
    return removed


def refuse_non_regular(path: Path) -> None:
    """A one-line error if `path` exists (following links) and is not a regular file."""
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as exc:  # a name too long, a folder this account cannot search: said with the mend
        raise _not_written(path, exc) from None
    if not stat.S_ISREG(info.st_mode):
        raise LocalpersError(
            f"{path} exists and is not a regular file (a directory, device, FIFO or socket), which is never"
            " replaced: move it away"
        )


def atomic_write_bytes(path: Path, data: bytes, *, through_link: bool = False) -> None:
    """Replace `path` with `data` all at once: temp file in the same folder, fsync, os.replace.

    `through_link`: where `path` is a symbolic link, the file it points to is replaced (beside it), and the link
    stays; otherwise the link itself is replaced by the file. A link to nothing, or one that loops, is refused
    (its readers refuse it too).
    """
    path = Path(path)
    if through_link and path.is_symlink():
        try:  # missing (an unmounted drive), or a loop (Python 3.11 raises RuntimeError for one)
            path = path.resolve(strict=True)
        except (OSError, RuntimeError):
            raise LocalpersError(
                f"{path} is a link to {os.readlink(path)}, which does not exist or loops; reconnect what it points"
                " to, or remove the link"
            ) from None
    refuse_non_regular(path)
    remove_stale_temp_files(path)
    try:
        fd, temp_name = tempfile.mkstemp(
            dir=path.parent, prefix=f".{_temp_stem(path.name)}.{os.getpid()}.", suffix=TEMP_SUFFIX
        )
    except OSError as exc:
        raise _not_written(path, exc) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp_name, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp_name)
        if isinstance(exc, OSError):
            raise _not_written(path, exc) from None
        raise
    fsync_directory(path.parent)


def _not_written(path: Path, exc: OSError) -> StorageError:
    """A full disk or a read-only folder: one line, and the promise that the old file is intact."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    mend = {
        errno.ENAMETOOLONG: "choose a shorter name",
        errno.ENOENT: "create its folder or choose another",
    }.get(exc.errno or 0, "free some disk space or fix the folder's permissions")
    return StorageError(
        f"cannot write {path} ({reason}); it was left as it was: {mend}, then run the command again"
    )


def atomic_write_text(path: Path, text: str, *, through_link: bool = False) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), through_link=through_link)


def write_cache_bytes(path: Path, data: bytes) -> bool:
    """A cache's write, atomic as any other, but never an error: False when it cannot be written (a folder or FIFO
    where it goes, a full disk). The cache then stays as it was, stale, and a later run rebuilds what it lacks; the
    work it would have saved is not lost to the command that made it."""
    try:
        atomic_write_bytes(path, data)
    except LocalpersError:
        return False
    return True


def fsync_directory(directory: Path) -> None:
    """Make a rename durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
