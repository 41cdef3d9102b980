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
Re-signing with new expiry dates or new keys is `localpers.bundle.resigning`'s; every command that writes
metadata holds the repository's lock (`localpers.bundle.repository_lock`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from localpers.atomic import atomic_write_bytes
from localpers.bundle.keys import ROLES, check_keys_outside, load_signer, load_signers
from localpers.bundle.manifest import parse_manifest
from localpers.bundle.repository_check import check_signed_metadata
from localpers.bundle.repository_files import TARGETS_DIR, copy_target, make_public
from localpers.bundle.repository_lock import repository_lock
from localpers.errors import InputError, LocalpersError

BUNDLE_PREFIX = "bundle/"
BACKBONE_PREFIX = "backbone/"  # backbone/<sha256>.gguf
METADATA_DIR = "metadata"
DEFAULT_EXPIRY_DAYS = {"root": 365, "targets": 90, "snapshot": 30, "timestamp": 7}
PUBLISH_ROLES = ("targets", "snapshot", "timestamp")  # the keys that `repo add` and `refresh --all` sign with


def _tuf() -> Any:
    """Import python-tuf lazily (it is only needed to publish and to pull)."""
    try:
        from tuf.api import metadata
    except ImportError:  # pragma: no cover - tuf is a declared dependency
        raise LocalpersError("signed repositories need the `tuf` package: pip install tuf") from None
    return metadata


def expiry_from_now(role: str, days: dict[str, int] | None) -> datetime:
    count = (days or {}).get(role, DEFAULT_EXPIRY_DAYS[role])
    return datetime.now(UTC).replace(microsecond=0) + timedelta(days=count)


# --------------------------------------------------------------------------------------------------
# Reading and writing repository metadata


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


def _write_metadata(path: Path, metadata: Any) -> bytes:
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
        return _tuf().Metadata.from_bytes(data), data
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
    metadata = _tuf()
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
    metadata = _tuf()
    repo.timestamp.signed.snapshot_meta = metadata.MetaFile(
        version=repo.snapshot.signed.version,
        length=len(snapshot_bytes),
        hashes={"sha256": hashlib.sha256(snapshot_bytes).hexdigest()},
    )
    repo.timestamp.signed.version += 1
    repo.timestamp.signed.expires = expiry_from_now("timestamp", expiry_days)
    repo.timestamp.sign(signers["timestamp"])
    _write_metadata(repo.metadata_dir / "timestamp.json", repo.timestamp)


def is_repository(directory: Path) -> bool:
    """Whether `directory` is a signed repository (it holds the first root, `metadata/1.root.json`)."""
    return (Path(directory) / METADATA_DIR / "1.root.json").is_file()


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
    metadata = _tuf()
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
