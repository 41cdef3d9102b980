"""What a served folder gives out: `ServedFile`, one resource with its size and sha256, and `RepositoryFiles`, the
files a signed repository exposes and nothing else (its TUF metadata, and targets whose bytes have the sha256
their names give), listed again as the publisher re-signs.

`localpers.bundle.serve_handler` answers the requests (`localpers.bundle.serve` runs the server); this module
decides which files exist for them. It writes nothing, and never follows a link or a path out of the repository's
folder.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from localpers.bundle.format import path_problem, sha256_of_file
from localpers.bundle.repository_files import TARGETS_DIR
from localpers.bundle.repository_metadata import METADATA_DIR
from localpers.errors import InputError

logger = logging.getLogger("localpers.bundle.serve")

# what a repository serves (`RepositoryFiles`): TUF metadata, and targets named by their sha256
_METADATA_NAME = re.compile(r"(?:[1-9][0-9]*\.)?(?:root|timestamp|snapshot|targets)\.json")
_TARGET_NAME = re.compile(r"[0-9a-f]{64}\.[^/]+")


@dataclass(frozen=True)
class ServedFile:
    """One fetchable resource: a listed file on disk, or the manifest's bytes in memory."""

    size: int
    sha256: str
    content_type: str
    path: Path | None = None
    data: bytes | None = None
    stamp: tuple[int, int, int, int] | None = None  # a file's `file_stamp` when it was hashed


class RepositoryFiles:
    """The files a repository serves, by URL path: its TUF metadata (`N.root.json`, `timestamp.json`,
    `N.snapshot.json`, `N.targets.json` and the unversioned copies) and its targets, each under the name
    `localpers repo` gives it (`targets/.../<sha256>.<name>`) and only when its bytes have that sha256; regular
    files only (no links, no `.partial` or hidden files). Nothing else under the folder is ever served: a keys
    folder put there, a stray or hand-placed file, a temporary file of a write in progress.

    The publisher re-signs while the server runs (`repo add`, `repo refresh`): a servable path that is on disk
    but not listed, or a listed file replaced or changed on disk (its `file_stamp`), has the folder
    listed again (only new or changed files are hashed again), so a pull sees the repository as it is now and
    the ETag is that of the bytes served. A path with nothing on disk is answered without a listing (every pull
    asks for a next root version that is not there), and so is one already refused as it stands. New files are
    hashed under the lock every request takes: the first request after a large target appears (a backbone) waits
    for its hash, once, which a server for local use accepts."""

    def __init__(self, directory: Path) -> None:
        for top in (METADATA_DIR, TARGETS_DIR):
            if (directory / top).is_symlink():
                raise InputError(
                    f"{directory / top} is a link; a repository's {top}/ is served only as a folder of its own"
                )
        self.directory = directory
        self._lock = threading.Lock()
        self._files: dict[str, ServedFile] = {}
        # servable-looking files on disk left out, as they stood (a file's stamp, `file_stamp`)
        self._refused: dict[str, tuple[int, int, int, int]] = {}
        self._list()

    def get(self, relative: str) -> ServedFile | None:
        if not servable_in_repository(relative):
            return None  # never listed, whatever is on disk: no listing for it either
        with self._lock:
            stamp = self._stamp(relative)
            if stamp is None or self._refused.get(relative) == stamp:
                return None
            known = self._files.get(relative)
            if known is None or known.stamp != stamp:
                self._list()
                if relative not in self._files:  # on disk but not a file the listing serves (a name it
                    self._refused[relative] = stamp  # skips, a linked folder): not listed again as it stands
            return self._files.get(relative)

    def values(self) -> list[ServedFile]:
        with self._lock:
            return list(self._files.values())

    def __len__(self) -> int:
        return len(self._files)

    def _stamp(self, relative: str) -> tuple[int, int, int, int] | None:
        try:
            return file_stamp((self.directory / relative).lstat())
        except (OSError, ValueError):  # ValueError: a NUL in the name
            return None

    def _list(self) -> None:
        files: dict[str, ServedFile] = {}
        refused: dict[str, tuple[int, int, int, int]] = {}
        for top in (METADATA_DIR, TARGETS_DIR):
            if (self.directory / top).is_symlink():  # swapped for a link while serving: nothing under it
                logger.warning("%s is now a link; not serving what it points to", self.directory / top)
                continue
            for path in sorted((self.directory / top).rglob("*")):
                relative = path.relative_to(self.directory).as_posix()
                if not servable_in_repository(relative) or path_problem(relative):
                    continue
                stamp = self._stamp(relative)
                if stamp is None:
                    continue  # gone while listed
                known = self._files.get(relative)
                if known is not None and known.stamp == stamp:
                    files[relative] = known
                    continue
                if self._refused.get(relative) == stamp or path.is_symlink() or not path.is_file():
                    refused[relative] = stamp
                    continue
                try:
                    sha256 = sha256_of_file(path)
                except OSError as exc:  # unreadable by this account: left out, the rest still served
                    logger.warning("%s cannot be read (%s); not serving it", path, exc.strerror)
                    if exc.errno in (errno.EACCES, errno.EPERM):  # a passing error is tried again next time
                        refused[relative] = stamp
                    continue
                if top == TARGETS_DIR and not path.name.startswith(sha256):
                    logger.warning(
                        "%s does not hold the bytes its name's sha256 promises (damaged, or put there by hand);"
                        " not serving it",
                        path,
                    )
                    refused[relative] = stamp
                    continue
                files[relative] = ServedFile(
                    size=stamp[0],
                    sha256=sha256,
                    content_type="application/json"
                    if relative.endswith(".json")
                    else "application/octet-stream",
                    path=path,
                    stamp=stamp,
                )
        self._files, self._refused = files, refused


def file_stamp(info: os.stat_result) -> tuple[int, int, int, int]:
    """What says a file on disk is still the one listed: size, modification time, inode (a file written anew is
    renamed into place under a new inode, whatever its size and the file system's clock) and change time (a file
    made readable again)."""
    return info.st_size, info.st_mtime_ns, info.st_ino, info.st_ctime_ns


def servable_in_repository(relative: str) -> bool:
    """Whether a repository serves the file at `relative` (a URL path without its leading "/"): TUF metadata by
    its names, targets by their hash-prefixed names (as `localpers repo` writes them)."""
    if any(part in ("", ".", "..") or part.startswith(".") for part in relative.split("/")):
        return False  # never a path out of the folder, nor a hidden file (a write's temporary file)
    if path_problem(relative):
        return False  # a name no bundle file may have (a colon, a backslash, a control character)
    top, _, rest = relative.partition("/")
    if top == METADATA_DIR:
        return _METADATA_NAME.fullmatch(rest) is not None
    if top == TARGETS_DIR:
        name = rest.rsplit("/", 1)[-1]
        return _TARGET_NAME.fullmatch(name) is not None and not name.endswith(".partial")
    return False
