"""Reading a signed bundle repository's metadata, and writing its files where the web server can read them.

`load_repository` reads the newest root, targets, snapshot and timestamp of a repository folder and checks that
this repository's keys signed them (`localpers.bundle.repository_check`): every command that signs anew starts
there. `read_dates` reads the expiry dates without that check, `is_repository` tells a repository folder from
another, `locked_repository` holds the repository's lock for a command that writes metadata. Signing and
publishing are `localpers.bundle.repository`'s and re-signing `localpers.bundle.resigning`'s; this module signs
nothing and never opens a network connection.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from localpers.atomic import atomic_write_bytes
from localpers.bundle.keys import ROLES
from localpers.bundle.repository_check import check_signed_metadata
from localpers.bundle.repository_files import TARGETS_DIR
from localpers.bundle.repository_lock import repository_lock
from localpers.errors import InputError, LocalpersError

BUNDLE_PREFIX = "bundle/"
BACKBONE_PREFIX = "backbone/"  # backbone/<sha256>.gguf
METADATA_DIR = "metadata"


def tuf_metadata() -> Any:
    """Import python-tuf lazily (it is only needed to publish and to pull)."""
    try:
        from tuf.api import metadata
    except ImportError:  # pragma: no cover - tuf is a declared dependency
        raise LocalpersError("signed repositories need the `tuf` package: pip install tuf") from None
    return metadata


@dataclass
class Repository:
    """The latest metadata of a repository directory, loaded for editing and re-signing."""

    directory: Path
    root: Any
    targets: Any
    snapshot: Any
    timestamp: Any
    # sha256 of each role file as read and verified (role -> hex; `load_repository`): what a rotation records
    verified_sha256: dict[str, str] = field(default_factory=dict)

    @property
    def metadata_dir(self) -> Path:
        return self.directory / METADATA_DIR

    @property
    def targets_dir(self) -> Path:
        return self.directory / TARGETS_DIR


def write_public(path: Path, data: bytes) -> None:
    """Write a repository file atomically, readable by the web server that will host it."""
    atomic_write_bytes(path, data)
    os.chmod(path, 0o644)


def write_metadata(path: Path, metadata: Any) -> bytes:
    data = metadata.to_bytes()
    write_public(path, data)
    return data


def read_metadata(path: Path, fix: str) -> Any:
    """The signed metadata file at `path`; one-line errors for a missing, unreadable or malformed file."""
    return _read_metadata_and_bytes(path, fix)[0]


def _read_metadata_and_bytes(path: Path, fix: str) -> tuple[Any, bytes]:
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise LocalpersError(f"{path}: no such file; {fix}") from None
    except OSError as exc:
        raise LocalpersError(f"{path}: cannot read ({exc.strerror}); {fix}") from None
    try:
        return tuf_metadata().Metadata.from_bytes(data), data
    except Exception as exc:  # python-tuf raises several types for malformed metadata
        raise InputError(f"{path}: not valid TUF metadata ({type(exc).__name__}: {exc})") from None


def load_repository(
    directory: Path, *, pending: dict[str, str] | None = None, finishing_with: Path | None = None
) -> Repository:
    """The latest root, targets, snapshot and timestamp of the repository at `directory`, each checked to be
    what this repository's keys signed (`repository_check`; `pending` for the commands that finish a stopped
    key rotation: the role files its record lets them re-sign, and `finishing_with` the keys folder they were given,
    whose missing record a refusal names): every command that signs anew starts here."""
    directory = Path(directory)
    fix = "it is not a repository: create one with `localpers repo init`"
    read = {role: _read_metadata_and_bytes(directory / METADATA_DIR / f"{role}.json", fix) for role in ROLES}
    loaded = {role: metadata for role, (metadata, _) in read.items()}
    root = _newest_root(directory / METADATA_DIR, loaded["root"], fix)
    check_signed_metadata(
        directory / METADATA_DIR,
        root,
        loaded["targets"],
        loaded["snapshot"],
        loaded["timestamp"],
        role_bytes={role: data for role, (_, data) in read.items()},
        pending=pending,
        finishing_with=finishing_with,
    )
    hashes = {role: hashlib.sha256(data).hexdigest() for role, (_, data) in read.items()}
    return Repository(directory, root, loaded["targets"], loaded["snapshot"], loaded["timestamp"], hashes)


def read_dates(directory: Path) -> dict[str, datetime]:
    """When each role's newest metadata in the repository at `directory` expires (UTC), read without checking
    signatures: it signs nothing, and a rotation under way is read as it stands."""
    fix = "it is not a repository: create one with `localpers repo init`"
    loaded = {role: read_metadata(Path(directory) / METADATA_DIR / f"{role}.json", fix) for role in ROLES}
    loaded["root"] = _newest_root(Path(directory) / METADATA_DIR, loaded["root"], fix)
    return {role: metadata.signed.expires for role, metadata in loaded.items()}


def _newest_root(metadata_dir: Path, root: Any, fix: str) -> Any:
    """`root` (root.json), or the newest `N.root.json` where that is newer: devices walk the numbered roots, so
    a command stopped between writing `N.root.json` and `root.json` (a rotation) must sign for what they trust."""
    versions = [
        int(p.name.split(".")[0]) for p in metadata_dir.glob("*.root.json") if p.name.split(".")[0].isdigit()
    ]
    newest = max(versions, default=0)
    if newest <= root.signed.version:
        return root
    return read_metadata(metadata_dir / f"{newest}.root.json", fix)


def is_repository(directory: Path) -> bool:
    """Whether `directory` is a signed repository (it holds the first root, `metadata/1.root.json`)."""
    return (Path(directory) / METADATA_DIR / "1.root.json").is_file()


@contextlib.contextmanager
def locked_repository(directory: Path, *, made: bool = True) -> Iterator[None]:
    """Hold the repository's lock for the block (`repository_lock`), saying on standard error when it waits.

    A folder that is not a repository (`made`: it must be one already; `init` makes it) is refused first, as
    `load_repository` refuses it, with no lock file left in it.
    """
    if made and not is_repository(Path(directory)):
        load_repository(Path(directory))  # raises: no such file, create one with `localpers repo init`

    def told() -> None:
        print(f"waiting for another `localpers repo` command to finish with {directory} ...", file=sys.stderr)

    with repository_lock(Path(directory), on_wait=told):
        yield
