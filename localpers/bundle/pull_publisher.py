"""Which publisher `localpers pull` may install from, and the record that binds an installed version to it.

What it does: `record_pull` writes the record of a version a pull installs (the manifest's sha256, or its signed
target hash; where it came from; its publisher's fingerprint) through `localpers.bundle.record`;
`refuse_another_publisher` refuses a signed repository of another publisher than the one the bundle in use came
from, unless the user named it with --trust; `asked_on_first_contact` lets the question about a new publisher's
key be asked only where no other publisher's bundle is in use.

What it does not do: trust or store a publisher's root (`localpers.bundle.trust`), refresh or verify signed
metadata (`localpers.bundle.signed`), download, stage or install anything (`localpers.bundle.pull`), or ask the
user (the CLI passes the question in). It opens no network connection.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from localpers.bundle.fetcher import repository_base
from localpers.bundle.locations import installed_bundle_dir
from localpers.bundle.record import recorded_publisher, write_record
from localpers.bundle.signed import SignedSource
from localpers.bundle.sources import BundleSource
from localpers.errors import LocalpersError
from localpers.paths import expand_user


def record_pull(
    source: BundleSource | SignedSource, version_dir: Path, given: str, manifest_bytes: bytes
) -> None:
    """Record the manifest installed as `version_dir` (its signed target hash where signed) and the source."""
    signed = isinstance(source, SignedSource)
    sha256 = source.manifest_sha256 if signed else hashlib.sha256(manifest_bytes).hexdigest()
    where = given if "://" in given else str(expand_user(given).resolve())
    publisher = source.fingerprint if isinstance(source, SignedSource) else None
    write_record(version_dir, sha256, where, signed=signed, publisher=publisher)


def _installed_publisher() -> str | None:
    installed = installed_bundle_dir()
    return recorded_publisher(installed) if installed is not None else None


def _another_publisher(base: str, fingerprint: str, publisher: str, trusted: bool) -> LocalpersError:
    known = "," if trusted else ", which this device does not trust,"
    return LocalpersError(
        f"{base} is signed by publisher key {fingerprint}{known} but the bundle in use came from"
        f" publisher {publisher}; nothing was installed. To switch publishers, pull again with --trust and the"
        " fingerprint of the publisher you mean (from them, not from this repository)"
    )


def refuse_another_publisher(source: SignedSource) -> None:
    """Refuse a repository of another publisher than the installed bundle's, unless the user named it (--trust)
    or confirmed it on first contact. The device trusts several (the demo publisher's root ships with it): a
    hostile mirror, or whoever sits on an http:// pull, served another trusted publisher's genuine repository at
    the usual address, and its bundle replaced the one in use."""
    publisher = _installed_publisher()
    if publisher is not None and publisher != source.fingerprint:
        raise _another_publisher(source.base, source.fingerprint, publisher, trusted=True)


def asked_on_first_contact(
    confirm: Callable[[str], bool] | None, source: str
) -> Callable[[str], bool] | None:
    """`confirm`, put only where no publisher's bundle is in use (or to its own publisher, whose trust store was
    lost). The question shows the server's own key: one keypress would let a hostile mirror at the usual address
    replace the bundle in use, where switching publishers takes --trust with the fingerprint from the publisher,
    as `refuse_another_publisher` says."""
    publisher = _installed_publisher()
    if confirm is None or publisher is None:
        return confirm

    def ask(fingerprint: str) -> bool:
        if fingerprint == publisher:
            return confirm(fingerprint)
        raise _another_publisher(repository_base(source), fingerprint, publisher, trusted=False)

    return ask
