"""Re-signing a repository: `repo refresh` (new expiry dates, the same keys) and `repo rotate` (new keys, by a TUF
root rotation), and when each role's metadata expires.

Each command holds the repository's lock (`localpers.bundle.repository_lock`) from reading the metadata to writing
it. What a repository is, and publishing into it, is `localpers.bundle.repository`'s; this module opens no network
connection and installs nothing.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from localpers.bundle.keys import ROLES, check_keys_outside, load_signer, load_signers
from localpers.bundle.repository import PUBLISH_ROLES, expiry_from_now, publish_targets, refresh_timestamp
from localpers.bundle.repository_metadata import (
    METADATA_DIR,
    Repository,
    load_repository,
    locked_repository,
    read_dates,
    write_public,
)
from localpers.bundle.rotation_pending import (
    clear_pending,
    pending_role_files,
    record_pending,
)
from localpers.errors import InputError, LocalpersError


def refresh(
    repo_dir: Path,
    keys_dir: Path,
    expiry_days: dict[str, int] | None = None,
    *,
    everything: bool = False,
    root: bool = False,
) -> dict[str, int]:
    """Re-sign with new expiry dates: the timestamp (and with `everything` targets and snapshot too; with
    `root` a new root version with the same keys, signed by the root key).

    Run the timestamp refresh more often than the timestamp expires (default 7 days): a device refuses
    an expired timestamp (freeze protection), and likewise the root after its year. With `everything` it also
    finishes a stopped rotation to the keys in `keys_dir` (`localpers.bundle.rotation_pending`). Returns role ->
    version.
    """
    with locked_repository(repo_dir):
        metadata_dir = Path(repo_dir) / METADATA_DIR
        repo = load_repository(
            Path(repo_dir), pending=pending_role_files(keys_dir, metadata_dir), finishing_with=keys_dir
        )
        roles = PUBLISH_ROLES if everything else ("timestamp",)
        signers = load_signers(repo.directory, repo.root, keys_dir, (*roles, "root") if root else roles)
        if root:
            _renew_root(repo, signers["root"], expiry_days)
        if everything:
            publish_targets(repo, dict(repo.targets.signed.targets), signers, expiry_days)
            clear_pending(keys_dir, metadata_dir)
        else:
            snapshot_bytes = (repo.metadata_dir / "snapshot.json").read_bytes()
            refresh_timestamp(repo, signers, expiry_days, snapshot_bytes)
    return {
        "root": int(repo.root.signed.version),
        "targets": int(repo.targets.signed.version),
        "snapshot": int(repo.snapshot.signed.version),
        "timestamp": int(repo.timestamp.signed.version),
    }


def _renew_root(repo: Repository, root_signer: Any, expiry_days: dict[str, int] | None) -> None:
    """Write root version N+1 with the same keys and a new expiry date (devices accept it: version N's root
    key signs it)."""
    repo.root.signed.version += 1
    repo.root.signed.expires = expiry_from_now("root", expiry_days)
    repo.root.signatures.clear()
    repo.root.sign(root_signer)
    root_bytes = repo.root.to_bytes()
    write_public(repo.metadata_dir / f"{repo.root.signed.version}.root.json", root_bytes)
    write_public(repo.metadata_dir / "root.json", root_bytes)


def expiry_dates(repo_dir: Path) -> dict[str, datetime]:
    """When each role's newest metadata expires (UTC)."""
    return read_dates(Path(repo_dir))


def rotate_keys(
    repo_dir: Path, old_keys_dir: Path, new_keys_dir: Path, expiry_days: dict[str, int] | None = None
) -> int:
    """Replace every role's key with the keys in `new_keys_dir` (TUF root rotation).

    The new root version is signed by the old and the new root key, so devices that trust the old
    root accept it and from then on trust only the new keys; targets, snapshot and timestamp are
    re-signed with the new keys. Before the new root is written, the role files as verified are recorded in
    `new_keys_dir` (`localpers.bundle.rotation_pending`), so a rotation stopped halfway can be finished and nothing
    else the old keys sign is. Returns the new root version.
    """
    with locked_repository(repo_dir):
        # a stopped rotation to the old keys, finished by this one
        metadata_dir = Path(repo_dir) / METADATA_DIR
        repo = load_repository(Path(repo_dir), pending=pending_role_files(old_keys_dir, metadata_dir))
        version = _rotate(repo, old_keys_dir, new_keys_dir, expiry_days)
        clear_pending(old_keys_dir, metadata_dir)
        return version


def _rotate(
    repo: Repository, old_keys_dir: Path, new_keys_dir: Path, expiry_days: dict[str, int] | None
) -> int:
    check_keys_outside(repo.directory, new_keys_dir, "--new-keys")
    new_signers = {role: load_signer(new_keys_dir, role, "--new-keys") for role in ROLES}
    trusted = repo.root.signed.roles["root"].keyids
    given = load_signer(old_keys_dir, "root").public_key.keyid  # a missing or unreadable key: its own error
    if given not in trusted and new_signers["root"].public_key.keyid in trusted:
        raise LocalpersError(
            f"the root of {repo.directory} already trusts the keys in {new_keys_dir}, not those in {old_keys_dir}:"
            " the rotation to them is done, or was stopped before it re-signed the other metadata;"
            f" `localpers repo refresh {repo.directory} --all --keys {new_keys_dir}` finishes it either way"
        )
    # a rotation to keys already trusted (the same folder, or old keys copied beside a new one) would report
    # success while the keys it replaces, often leaked ones, kept their power
    for role in ROLES:
        keyid = new_signers[role].public_key.keyid
        holders = [held for held in ROLES if keyid in repo.root.signed.roles[held].keyids]
        if holders:
            raise InputError(
                f"{new_keys_dir}: its {role} key is one {repo.directory} already trusts (as its {holders[0]} key);"
                " a rotation needs new keys: make them with `localpers repo keygen DIR`"
            )
    old_root = load_signers(repo.directory, repo.root, old_keys_dir, ("root",))["root"]  # what devices trust
    root = repo.root.signed
    for role in ROLES:
        for keyid in list(root.roles[role].keyids):
            root.revoke_key(keyid, role)
        root.add_key(new_signers[role].public_key, role)
    root.version += 1
    root.expires = expiry_from_now("root", expiry_days)
    repo.root.signatures.clear()
    repo.root.sign(old_root, append=True)
    repo.root.sign(new_signers["root"], append=True)
    root_bytes = repo.root.to_bytes()
    verified = {f"{role}.json": repo.verified_sha256[role] for role in PUBLISH_ROLES}
    record_pending(new_keys_dir, root.version, root_bytes, verified)
    write_public(repo.metadata_dir / f"{root.version}.root.json", root_bytes)
    write_public(repo.metadata_dir / "root.json", root_bytes)
    publish_targets(repo, dict(repo.targets.signed.targets), new_signers, expiry_days)
    clear_pending(new_keys_dir, repo.metadata_dir)
    return int(root.version)
