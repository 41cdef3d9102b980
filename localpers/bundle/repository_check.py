"""Whether a repository's metadata on disk is what `localpers repo` signed, before a command signs anything anew.

The signing commands (`repo add`, `add-backbone`, `refresh`, `rotate`) load the metadata in `metadata/` and sign
its next versions. Without this check they signed whatever the files said: anyone who could write the folder (a
shared or synced folder, a copy fetched back from the web host) had a `repo refresh --all` sign their bundle's
targets, or a `repo refresh --root` trust their root key beside the publisher's.

What it checks, as a device would: every numbered root from `1.root.json` is signed by the root before it and by
itself, `root.json` is one of them; targets, snapshot and timestamp are signed by the keys the newest root trusts for
them; and no role is older than what the role above it names (a rollback). The one exception is a rotation stopped
before it re-signed the other roles (`localpers.bundle.rotation_pending`): a command given the new keys passes the
role files the rotation verified (`pending`, name -> sha256; `finishing_with`, the keys folder holding its record),
and a role signed by an earlier root's keys is taken when its bytes are exactly those, never other metadata the
rotated-out (perhaps leaked) keys signed. It does not check expiry (renewing expired metadata is what `refresh` is
for), nor the targets' files (`serve` and devices do).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from localpers.bundle.rotation_pending import PENDING_FILE
from localpers.errors import InputError

MEND = (
    "it was changed by something other than `localpers repo`: put back the metadata folder from a copy you trust"
    " before signing anything"
)


def check_signed_metadata(
    metadata_dir: Path,
    root: Any,
    targets: Any,
    snapshot: Any,
    timestamp: Any,
    *,
    role_bytes: Mapping[str, bytes],
    pending: Mapping[str, str] | None = None,
    finishing_with: Path | None = None,
) -> None:
    """Refuse, naming the file, metadata this repository's own keys did not sign (see the module docstring).

    `role_bytes` are the files' bytes the metadata was parsed from (role -> bytes), `pending` what a stopped
    rotation's record lets the finishing command re-sign (file name -> sha256)."""
    roots = _verified_roots(metadata_dir, root)
    for role, metadata in (("targets", targets), ("snapshot", snapshot), ("timestamp", timestamp)):
        if _signed_by(roots[-1], role, metadata):
            continue
        recorded = (pending or {}).get(f"{role}.json")
        if recorded is None or hashlib.sha256(role_bytes[role]).hexdigest() != recorded:
            where = f"{metadata_dir / f'{role}.json'}: not signed by this repository's {role} key"
            if finishing_with is not None and not pending:  # the command that finishes a rotation: no record
                raise InputError(
                    f"{where}, and {finishing_with / PENDING_FILE} records no rotation of this repository to those"
                    " keys; if a rotation was stopped, restore the metadata folder from a copy made before it and"
                    f" rotate again; otherwise {MEND}"
                )
            raise InputError(
                f"{where}; if a key rotation was stopped, finish it with `localpers repo refresh"
                f" {metadata_dir.parent} --all --keys NEW`; otherwise {MEND}"
            )
        if not any(_signed_by(earlier, role, metadata) for earlier in roots[:-1]):
            raise InputError(
                f"{metadata_dir / f'{role}.json'}: not signed by any key this repository's roots have trusted"
                f" for {role}; {MEND}"
            )
    named = snapshot.signed.meta.get("targets.json")
    if named is not None and targets.signed.version < named.version:
        raise InputError(
            f"{metadata_dir / 'targets.json'}: version {targets.signed.version} is older than the version"
            f" {named.version} the snapshot names (a rollback); {MEND}"
        )
    if timestamp.signed.snapshot_meta.version > snapshot.signed.version:
        raise InputError(
            f"{metadata_dir / 'snapshot.json'}: version {snapshot.signed.version} is older than the version"
            f" {timestamp.signed.snapshot_meta.version} the timestamp names (a rollback); {MEND}"
        )


def _verified_roots(metadata_dir: Path, newest: Any) -> list[Any]:
    """Roots 1..`newest`'s version, each checked against the one before it (the first against itself)."""
    from tuf.api.metadata import Metadata, Root

    chain: list[Any] = []
    for version in range(1, int(newest.signed.version) + 1):
        path = metadata_dir / f"{version}.root.json"
        try:
            current = Metadata[Root].from_bytes(path.read_bytes())
        except FileNotFoundError:
            raise InputError(f"{path}: missing, and devices walk every root version; {MEND}") from None
        except Exception as exc:  # python-tuf raises several types for malformed metadata
            raise InputError(f"{path}: not root metadata ({type(exc).__name__}: {exc}); {MEND}") from None
        if current.signed.version != version:
            raise InputError(f"{path}: holds root version {current.signed.version}; {MEND}")
        signers = [chain[-1], current] if chain else [current]
        if not all(_signed_by(signer, "root", current) for signer in signers):
            raise InputError(f"{path}: not signed by the root keys before it; {MEND}")
        chain.append(current)
    if newest.signed_bytes != chain[-1].signed_bytes:
        raise InputError(
            f"{metadata_dir / 'root.json'}: not the root {newest.signed.version}.root.json holds; {MEND}"
        )
    return chain


def _signed_by(root: Any, role: str, metadata: Any) -> bool:
    try:
        root.signed.verify_delegate(role, metadata.signed_bytes, metadata.signatures)
    except Exception:  # python-tuf: UnsignedMetadataError, or a role the root does not name
        return False
    return True
