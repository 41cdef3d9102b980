"""Files a publisher's repository holds besides its metadata: a target copied in under its hash-prefixed name, and
the read bits a web server needs. `localpers.bundle.repository` signs the metadata that names them; this module
signs nothing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from localpers.atomic import fsync_directory
from localpers.bundle.format import sha256_of_file
from localpers.errors import InputError, LocalpersError

TARGETS_DIR = "targets"


def copy_target(repository: Path, target_path: str, source: Path, expected_sha256: str | None = None) -> Any:
    """Copy `source` into `repository`'s targets/ under its hash-prefixed name; return the TargetFile of the bytes
    copied.

    The copy is hashed, not the source: read twice, a source changed between the reads (another publish into the
    same folder) was signed with one hash and stored with other bytes, and devices refused the repository.
    `expected_sha256` (what was verified, or the hash a target's name carries) must match the copy. A file already
    under the name is kept only when its bytes are right: one a power cut left empty was kept by every later add.
    The copy is on disk before the metadata naming it is written.
    """
    from tuf.api import metadata

    if not source.is_file():
        raise LocalpersError(f"{source}: no such file to publish as {target_path}")
    directory, _, name = target_path.rpartition("/")
    folder = repository / TARGETS_DIR / directory
    folder.mkdir(parents=True, exist_ok=True)
    for parent in (folder, *folder.parents):
        if parent == repository:
            break
        make_public(parent, 0o755)
    partial = folder / f".{name}.{os.getpid()}.partial"  # hidden and .partial: never served
    try:
        shutil.copyfile(source, partial)
        with partial.open("rb+") as written:
            os.fsync(written.fileno())
        info = metadata.TargetFile.from_file(target_path, str(partial), ["sha256"])
        sha256 = info.hashes["sha256"]
        if expected_sha256 is not None and sha256 != expected_sha256:
            raise InputError(
                f"{source}: its bytes changed while they were published (sha256 {sha256[:12]}, not the"
                f" {expected_sha256[:12]} checked before); publish it again"
            )
        destination = folder / f"{sha256}.{name}"
        if _holds(destination, info.length, sha256):
            partial.unlink()
        else:
            make_public(partial, 0o644)
            os.replace(partial, destination)
            fsync_directory(folder)
    except BaseException:  # Ctrl-C or a full disk: no half copy stays in what is uploaded
        with contextlib.suppress(OSError):
            partial.unlink()
        raise
    return info


def _holds(path: Path, length: int, sha256: str) -> bool:
    """Whether `path` is a regular file of `length` bytes hashing to `sha256`."""
    try:
        if not stat.S_ISREG(path.lstat().st_mode) or path.stat().st_size != length:
            return False
    except OSError:
        return False
    return sha256_of_file(path) == sha256


def make_public(path: Path, mode: int) -> None:
    """Add the read (and for folders search) bits a web server needs: a publisher's `umask 077` left targets 0600
    and their folders 0700, which the server then refused to every device. Bits already set (a shared group's
    write, setgid) stay; a folder of another account that cannot be changed is left as it is."""
    current = stat.S_IMODE(path.stat().st_mode)
    if current | mode != current:
        with contextlib.suppress(PermissionError):
            os.chmod(path, current | mode)
