"""The publisher's signed bundle repository: TUF metadata (python-tuf's Metadata API) over a bundle.

A repository is a directory of plain static files that any web server can host:

    metadata/1.root.json, 2.root.json ...   every root version (devices walk them to follow key rotations)
    metadata/timestamp.json                 the only file fetched without a version: short expiry
    metadata/<N>.snapshot.json, <N>.targets.json   consistent snapshots, never overwritten
    metadata/root.json, snapshot.json, targets.json   the publisher's copies of the latest versions
    targets/bundle/<dir>/<sha256>.<name>    each bundle file (and manifest.json) under its hash
    targets/backbone/<sha256>.<sha256>.gguf optional: the backbone GGUF (`localpers repo add-backbone`)

The bundle's files are TUF targets named `bundle/<path>` (`bundle/manifest.json` among them), with
length and sha256, so a device downloads no more than the signed length of any file. Keys are ed25519
(one per top-level role, threshold 1), kept by the publisher as PEM files in a keys directory that is
never part of the repository (`localpers.bundle.keys`). This module signs and writes files; it never opens a
network connection and never installs anything (see `localpers.bundle.signed` for the device's side).
Reading the metadata back, checked, is `localpers.bundle.repository_metadata`'s; re-signing with new expiry dates
or new keys is `localpers.bundle.resigning`'s; every command that writes metadata holds the repository's lock
(`localpers.bundle.repository_lock`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from localpers.bundle.keys import ROLES, check_keys_outside, load_signer, load_signers
from localpers.bundle.manifest import parse_manifest
from localpers.bundle.repository_files import TARGETS_DIR, copy_target, make_public
from localpers.bundle.repository_metadata import (
    BUNDLE_PREFIX,
    METADATA_DIR,
    Repository,
    is_repository,
    load_repository,
    locked_repository,
    read_metadata,
    tuf_metadata,
    write_metadata,
    write_public,
)
from localpers.errors import InputError, LocalpersError

DEFAULT_EXPIRY_DAYS = {"root": 365, "targets": 90, "snapshot": 30, "timestamp": 7}
PUBLISH_ROLES = ("targets", "snapshot", "timestamp")  # the keys that `repo add` and `refresh --all` sign with


def expiry_from_now(role: str, days: dict[str, int] | None) -> datetime:
    count = (days or {}).get(role, DEFAULT_EXPIRY_DAYS[role])
    return datetime.now(UTC).replace(microsecond=0) + timedelta(days=count)


def check_keys(repo_dir: Path, keys_dir: Path, roles: Iterable[str] = PUBLISH_ROLES) -> None:
    """Check up front that `keys_dir` holds this repository's keys for `roles` (see `load_signers`)."""
    repo = load_repository(Path(repo_dir))
    load_signers(repo.directory, repo.root, keys_dir, roles)


def _publish_snapshot_and_timestamp(
    repo: Repository,
    signers: dict[str, Any],
    expiry_days: dict[str, int] | None,
    *,
    new_targets: bytes | None,
) -> None:
    """Write a new snapshot (if targets changed or it is re-signed) and always a new timestamp."""
    metadata = tuf_metadata()
    if new_targets is not None:
        repo.snapshot.signed.meta["targets.json"] = metadata.MetaFile(
            version=repo.targets.signed.version,
            length=len(new_targets),
            hashes={"sha256": hashlib.sha256(new_targets).hexdigest()},
        )
    repo.snapshot.signed.version += 1
    repo.snapshot.signed.expires = expiry_from_now("snapshot", expiry_days)
    repo.snapshot.sign(signers["snapshot"])
    snapshot_bytes = repo.snapshot.to_bytes()
    write_public(repo.metadata_dir / f"{repo.snapshot.signed.version}.snapshot.json", snapshot_bytes)
    write_public(repo.metadata_dir / "snapshot.json", snapshot_bytes)
    refresh_timestamp(repo, signers, expiry_days, snapshot_bytes)


def refresh_timestamp(
    repo: Repository, signers: dict[str, Any], expiry_days: dict[str, int] | None, snapshot_bytes: bytes
) -> None:
    """Sign a new timestamp naming `snapshot_bytes` (the snapshot just written, or the one on disk)."""
    metadata = tuf_metadata()
    repo.timestamp.signed.snapshot_meta = metadata.MetaFile(
        version=repo.snapshot.signed.version,
        length=len(snapshot_bytes),
        hashes={"sha256": hashlib.sha256(snapshot_bytes).hexdigest()},
    )
    repo.timestamp.signed.version += 1
    repo.timestamp.signed.expires = expiry_from_now("timestamp", expiry_days)
    repo.timestamp.sign(signers["timestamp"])
    write_metadata(repo.metadata_dir / "timestamp.json", repo.timestamp)


def refuse_keys_inside_a_repository(keys_dir: Path) -> None:
    """Refuse a new keys directory inside a signed repository (it or a folder above it is one): `init` and every
    signing command refuse such keys, and a web server hosting the repository would serve them."""
    resolved = Path(keys_dir).resolve()
    for folder in (resolved, *resolved.parents):
        if is_repository(folder):
            raise InputError(
                f"{keys_dir} is inside the repository {folder}: private keys must never be uploaded with it;"
                " give a directory outside it"
            )


def init_repository(directory: Path, keys_dir: Path, expiry_days: dict[str, int] | None = None) -> str:
    """Create an empty signed repository at `directory` with the keys in `keys_dir`; returns the
    root keyid (the fingerprint devices pin)."""
    directory = Path(directory)
    check_keys_outside(directory, keys_dir)
    if (directory / METADATA_DIR / "root.json").exists():
        raise LocalpersError(f"{directory} is already a repository; use `localpers repo add` to publish")
    if directory.exists() and not directory.is_dir():
        raise InputError(
            f"{directory} is a file, not a folder; give a new or empty folder for the repository"
        )
    # hidden entries (a version control folder) may stay, and so may the empty folders of an init cut short
    stray = (
        sorted(
            p.name
            for p in directory.iterdir()
            if not p.name.startswith(".")
            and not (p.name in (METADATA_DIR, TARGETS_DIR) and p.is_dir() and not any(p.iterdir()))
        )
        if directory.is_dir()
        else []
    )
    if stray:  # a repository folder is uploaded whole (`rsync -a my-repo/ host:`): nothing else belongs there
        shown = ", ".join(stray[:3]) + (f" and {len(stray) - 3} more" if len(stray) > 3 else "")
        raise InputError(
            f"{directory} already holds {shown}; everything in a repository's folder is uploaded with it: give a"
            " new or empty folder"
        )
    signers = {role: load_signer(keys_dir, role) for role in ROLES}
    created = not directory.exists()
    (directory / METADATA_DIR).mkdir(parents=True, exist_ok=True)
    (directory / TARGETS_DIR).mkdir(exist_ok=True)
    for folder in ([directory] if created else []) + [directory / METADATA_DIR, directory / TARGETS_DIR]:
        make_public(folder, 0o755)
    with locked_repository(directory, made=False):
        if (directory / METADATA_DIR / "root.json").exists():  # another init got here first
            raise LocalpersError(f"{directory} is already a repository; use `localpers repo add` to publish")
        # Written in a hidden folder and renamed into place: an init stopped halfway left a root.json that init
        # called a repository and `repo add` did not, and only deleting the folder by hand mended it.
        for leftover in directory.glob(f".{METADATA_DIR}-*.partial"):
            shutil.rmtree(leftover, ignore_errors=True)
        staging = directory / f".{METADATA_DIR}-{os.getpid()}.partial"
        try:
            (staging / METADATA_DIR).mkdir(parents=True)
            fingerprint = _init(staging, signers, expiry_days)
            make_public(staging / METADATA_DIR, 0o755)
            os.replace(staging / METADATA_DIR, directory / METADATA_DIR)  # over the empty folder made above
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return fingerprint


def _init(directory: Path, signers: dict[str, Any], expiry_days: dict[str, int] | None) -> str:
    """Sign and write the first metadata of every role into `directory`'s metadata folder; the root keyid."""
    metadata = tuf_metadata()
    root = metadata.Root(expires=expiry_from_now("root", expiry_days), consistent_snapshot=True)
    for role, signer in signers.items():
        root.add_key(signer.public_key, role)
    root_md = metadata.Metadata(root)
    root_md.sign(signers["root"])
    root_bytes = root_md.to_bytes()
    write_public(directory / METADATA_DIR / "1.root.json", root_bytes)
    write_public(directory / METADATA_DIR / "root.json", root_bytes)

    targets_md = metadata.Metadata(metadata.Targets(expires=expiry_from_now("targets", expiry_days)))
    targets_md.sign(signers["targets"])
    targets_bytes = targets_md.to_bytes()
    write_public(directory / METADATA_DIR / "1.targets.json", targets_bytes)
    write_public(directory / METADATA_DIR / "targets.json", targets_bytes)

    snapshot_md = metadata.Metadata(metadata.Snapshot(expires=expiry_from_now("snapshot", expiry_days)))
    snapshot_md.signed.version = 0  # _publish_snapshot_and_timestamp bumps it to 1
    timestamp_md = metadata.Metadata(metadata.Timestamp(expires=expiry_from_now("timestamp", expiry_days)))
    timestamp_md.signed.version = 0
    repo = Repository(directory, root_md, targets_md, snapshot_md, timestamp_md)
    _publish_snapshot_and_timestamp(repo, signers, expiry_days, new_targets=targets_bytes)
    return signers["root"].public_key.keyid


def root_keyid(repo_dir: Path) -> str:
    """The keyid of the first root key of version 1: the publisher's fingerprint."""
    path = Path(repo_dir) / METADATA_DIR / "1.root.json"
    root = read_metadata(path, "not a repository: create one with `localpers repo init`")
    if root.signed.type != "root" or not root.signed.roles["root"].keyids:
        raise InputError(f"{path}: not root metadata with a root key")
    return sorted(root.signed.roles["root"].keyids)[0]


def add_bundle(
    repo_dir: Path, bundle_dir: Path, keys_dir: Path, expiry_days: dict[str, int] | None = None
) -> int:
    """Publish the bundle at `bundle_dir` (verified first) as the repository's bundle targets, replacing
    the previous bundle's; signs new targets, snapshot and timestamp. Returns the new targets version."""
    from localpers.bundle.format import (
        MANIFEST_NAME,
        PUBLISH_ADVICE,
        advising,
        check_given_bundle_dir,
        verify_bundle,
    )

    check_keys_outside(repo_dir, keys_dir)
    check_given_bundle_dir(Path(bundle_dir))
    with advising(PUBLISH_ADVICE):
        bundle = verify_bundle(Path(bundle_dir))
    with locked_repository(repo_dir):
        repo = load_repository(Path(repo_dir))
        signers = load_signers(repo.directory, repo.root, keys_dir, PUBLISH_ROLES)  # before a file is copied
        kept = {
            path: info
            for path, info in repo.targets.signed.targets.items()
            if not path.startswith(BUNDLE_PREFIX)
        }
        # each file as verified, or refused: a publish into the same folder meanwhile signed a manifest and targets
        # that disagreed (every device refused the repository)
        for relative, entry in bundle.manifest["files"].items():
            kept[BUNDLE_PREFIX + relative] = copy_target(
                repo.directory, BUNDLE_PREFIX + relative, bundle.directory / relative, entry["sha256"]
            )
        manifest_target = BUNDLE_PREFIX + MANIFEST_NAME
        kept[manifest_target] = copy_target(repo.directory, manifest_target, bundle.directory / MANIFEST_NAME)
        directory, _, name = manifest_target.rpartition("/")
        copied = repo.targets_dir / directory / f"{kept[manifest_target].hashes['sha256']}.{name}"
        # compared as the manifest's own parser reads it, written out the same way (a NaN equals itself there)
        as_copied = parse_manifest(copied.read_bytes(), str(copied))
        if json.dumps(as_copied, sort_keys=True) != json.dumps(bundle.manifest, sort_keys=True):
            raise InputError(
                f"{bundle.directory / MANIFEST_NAME}: changed while it was published; publish the bundle again"
            )
        return publish_targets(repo, kept, signers, expiry_days)


def add_file_target(
    repo_dir: Path,
    target_path: str,
    source: Path,
    keys_dir: Path,
    expiry_days: dict[str, int] | None = None,
    expected_sha256: str | None = None,
) -> int:
    """Publish one more file (e.g. the backbone GGUF as `backbone/<sha256>.gguf`) next to the bundle;
    `expected_sha256`: the hash its bytes must have (the one its target name carries)."""
    with locked_repository(repo_dir):
        repo = load_repository(Path(repo_dir))
        # before the file is copied
        signers = load_signers(repo.directory, repo.root, keys_dir, PUBLISH_ROLES)
        targets = dict(repo.targets.signed.targets)
        targets[target_path] = copy_target(repo.directory, target_path, Path(source), expected_sha256)
        return publish_targets(repo, targets, signers, expiry_days)


def publish_targets(
    repo: Repository, targets: dict[str, Any], signers: dict[str, Any], expiry_days: dict[str, int] | None
) -> int:
    """Sign `targets` as the next targets version, then a new snapshot and timestamp; returns the version."""
    repo.targets.signed.targets = targets
    repo.targets.signed.version += 1
    repo.targets.signed.expires = expiry_from_now("targets", expiry_days)
    repo.targets.sign(signers["targets"])
    targets_bytes = repo.targets.to_bytes()
    write_public(repo.metadata_dir / f"{repo.targets.signed.version}.targets.json", targets_bytes)
    write_public(repo.metadata_dir / "targets.json", targets_bytes)
    _publish_snapshot_and_timestamp(repo, signers, expiry_days, new_targets=targets_bytes)
    return int(repo.targets.signed.version)
