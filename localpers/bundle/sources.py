"""Where `localpers pull` reads a bundle from: a signed repository (a URL or a directory, through
`localpers.bundle.signed`) or, with --unsigned, a plain bundle directory on this machine.

What it does: choose the source for the argument a user gave (`open_source`), refusing an empty argument, a
malformed --trust fingerprint, and an unsigned directory without --unsigned; read a plain directory's manifest
(capped) and open its listed files, refusing one that resolves outside the bundle or is not a regular file.

What it does not do: download, check sizes and hashes (`localpers.bundle.pull_downloads`), stage or install
(`localpers.bundle.pull`), or verify signed metadata (`localpers.bundle.signed`). Only a `SignedSource` opens a
network connection.
"""

from __future__ import annotations

import contextlib
import http.client
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, Protocol

from localpers.bundle.fetcher import is_signed_repository
from localpers.bundle.format import MANIFEST_NAME, MAX_MANIFEST_BYTES, BundleProblem, advising
from localpers.bundle.signed import SignedSource
from localpers.bundle.trust import checked_fingerprint
from localpers.errors import InputError, LocalpersError
from localpers.paths import expand_user

DEFAULT_TIMEOUT_S = 30.0


class BundleSource(Protocol):
    description: str

    def read_manifest(self) -> bytes: ...

    def open_file(self, relative: str) -> contextlib.AbstractContextManager[BinaryIO]: ...

    def where(self, relative: str) -> str: ...


class DirectorySource:
    """A bundle directory on this machine (a mounted share, a USB stick, a publisher's output)."""

    def __init__(self, directory: Path) -> None:
        if directory.is_file() and directory.name == MANIFEST_NAME:
            directory = directory.parent
        if not (directory / MANIFEST_NAME).is_file():
            raise BundleProblem(f"{directory}: no manifest.json there, so it is not a bundle directory")
        self.directory = directory
        self.root = directory.resolve()
        self.description = str(directory)

    def where(self, relative: str) -> str:
        return str(self.directory / relative)

    def read_manifest(self) -> bytes:
        with (self.directory / MANIFEST_NAME).open("rb") as handle:
            return _read_capped(handle, MAX_MANIFEST_BYTES + 1, self.where(MANIFEST_NAME))

    @contextlib.contextmanager
    def open_file(self, relative: str) -> Iterator[BinaryIO]:
        path = self.directory / relative
        try:
            resolved = path.resolve()
            info = path.stat()
        except FileNotFoundError:
            raise BundleProblem(
                f"{path}: listed in the manifest but missing from the source bundle"
            ) from None
        except (OSError, RuntimeError) as exc:
            raise LocalpersError(f"{path}: cannot be read ({exc})") from None
        if not resolved.is_relative_to(self.root):
            raise BundleProblem(f"{path}: resolves outside the source bundle (to {resolved}); refusing it")
        if not stat.S_ISREG(info.st_mode):  # a FIFO or device would hang or never end
            raise BundleProblem(f"{path}: is not a regular file; refusing it")
        with path.open("rb") as handle:
            yield handle


def open_source(
    source: str,
    timeout: float = DEFAULT_TIMEOUT_S,
    *,
    trust: str | None = None,
    unsigned: bool = False,
    on_bytes: Callable[[int], None] | None = None,
    confirm: Callable[[str], bool] | None = None,
) -> BundleSource | SignedSource:
    """A `SignedSource` for a URL or a repository directory; a `DirectorySource` only with `unsigned`.

    Every URL is pulled as a signed repository: an unsigned bundle over the network is never trusted.
    """
    if trust is not None:
        trust = checked_fingerprint(trust)  # a malformed --trust is refused before anything is read
    if not source.strip():  # Path("") is the working directory: an empty argument must not pull from there
        raise InputError("the source is empty; give a repository directory or an http(s) URL")
    if is_signed_repository(source):
        if unsigned:
            raise InputError(
                f"{source}: --unsigned applies only to a local bundle directory; this is a signed repository:"
                " pull it without --unsigned"
            )
        return SignedSource(source, timeout=timeout, trust=trust, on_bytes=on_bytes, confirm=confirm)
    path = expand_user(source)
    if not path.exists():
        raise InputError(f"{source}: no such directory; give a repository directory or an http(s) URL")
    with advising("give a signed repository's directory (`localpers repo`) or a bundle directory"):
        directory = DirectorySource(path)
    if not unsigned:  # a flag the argument needs: a usage error, as --unsigned given for a repository is
        raise InputError(
            f"{source}: an unsigned bundle directory; publish it into a signed repository with"
            " `localpers repo add`, or install it anyway with --unsigned (nothing vouches for it)"
        )
    return directory


def _read_capped(stream: BinaryIO, limit: int, where: str) -> bytes:
    try:
        data = stream.read(limit)
    except (OSError, http.client.HTTPException) as exc:
        raise LocalpersError(f"{where}: reading failed ({exc}); try again") from None
    if len(data) >= limit:
        raise BundleProblem(f"{where}: larger than {limit - 1} bytes, too large for a manifest; not a bundle")
    return data
