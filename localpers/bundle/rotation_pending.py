"""A key rotation under way, recorded in the new keys' folder: which role files the rotated-out keys may still sign.

`repo rotate` writes a new root trusting new keys, then re-signs targets, snapshot and timestamp with them. Stopped
between the two, the repository holds roles signed by keys its newest root no longer trusts, and the commands that
finish the rotation (`repo refresh --all --keys NEW`, or `repo rotate` again) must re-sign them. They must not
re-sign anything else the old keys signed: a rotation is often made because those keys leaked, and whoever holds them
and can write the repository folder would have the publisher's new keys sign their targets.

So before it writes the new root, `rotate` records in the NEW keys' folder (private, never part of the repository)
the new root it is about to write (its version and sha256: the record follows the repository wherever the folder is
moved or mounted) and the sha256 of each role file as it verified them. A command given those keys accepts a role
signed by an earlier root's keys only when the repository holds that root and the role's bytes are exactly those;
the record goes once every role is signed by the new keys. This module only reads and writes the record; the
checking is `localpers.bundle.repository_check`'s.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from localpers.atomic import atomic_write_text
from localpers.errors import InputError

PENDING_FILE = "rotation-pending.json"
ROLE_FILES = ("targets.json", "snapshot.json", "timestamp.json")


def record_pending(keys_dir: Path, root_version: int, root_bytes: bytes, role_files: dict[str, str]) -> None:
    """Record, in `keys_dir`, a rotation to these keys that is about to write `root_bytes` as root `root_version`
    over the role files `role_files` (name -> sha256)."""
    rotations = _read(keys_dir)
    rotations[hashlib.sha256(root_bytes).hexdigest()] = {
        "root_version": root_version,
        "role_files": role_files,
    }
    _write(keys_dir, rotations)


def pending_role_files(keys_dir: Path, metadata_dir: Path) -> dict[str, str]:
    """The role files (name -> sha256) a rotation to the keys in `keys_dir` left signed by the old keys in the
    repository whose metadata is `metadata_dir`; empty when no such rotation is under way."""
    rotations = _read(keys_dir)
    key = _rotation_of(rotations, metadata_dir)
    return dict(rotations[key]["role_files"]) if key else {}


def clear_pending(keys_dir: Path, metadata_dir: Path) -> None:
    """Forget the rotation of the repository at `metadata_dir` once every role is signed by these keys (another
    repository's, still under way, stays recorded)."""
    rotations = _read(keys_dir)
    key = _rotation_of(rotations, metadata_dir)
    if key is None:
        return
    del rotations[key]
    if rotations:
        _write(keys_dir, rotations)
    else:
        (Path(keys_dir) / PENDING_FILE).unlink(missing_ok=True)


def _rotation_of(rotations: dict[str, dict], metadata_dir: Path) -> str | None:
    """The recorded rotation whose new root this repository holds, or None."""
    for key, rotation in rotations.items():
        root = Path(metadata_dir) / f"{rotation['root_version']}.root.json"
        try:
            if hashlib.sha256(root.read_bytes()).hexdigest() == key:
                return key
        except OSError:
            continue
    return None


def _read(keys_dir: Path) -> dict[str, dict]:
    if not Path(keys_dir).is_dir():
        return {}  # no keys folder: what the command says about that is `localpers.bundle.keys`'s
    path = Path(keys_dir) / PENDING_FILE
    fix = (
        "restore the repository's metadata folder from a copy made before the rotation, delete this file and run"
        " `localpers repo rotate` again"
    )
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{path}: not a record of key rotations ({type(exc).__name__}); {fix}") from None
    rotations = document.get("rotations") if isinstance(document, dict) else None
    if not isinstance(rotations, dict) or not all(_is_rotation(rotation) for rotation in rotations.values()):
        raise InputError(
            f"{path}: field 'rotations' is not a map of new roots to their version and role files' sha256; {fix}"
        )
    return rotations


def _is_rotation(rotation: object) -> bool:
    if not isinstance(rotation, dict):
        return False
    version, files = rotation.get("root_version"), rotation.get("role_files")
    return (
        isinstance(version, int)
        and not isinstance(version, bool)
        and version > 0
        and isinstance(files, dict)
        and all(name in ROLE_FILES and isinstance(digest, str) for name, digest in files.items())
    )


def _write(keys_dir: Path, rotations: dict[str, dict]) -> None:
    atomic_write_text(Path(keys_dir) / PENDING_FILE, json.dumps({"rotations": rotations}, indent=1) + "\n")
