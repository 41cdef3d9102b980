"""A key rotation under way, recorded in the new keys' folder: which role files the rotated-out keys may still sign.

`repo rotate` writes a new root trusting new keys, then re-signs targets, snapshot and timestamp with them. Stopped
between the two, the repository holds roles signed by keys its newest root no longer trusts, and the commands that
finish the rotation (`repo refresh --all --keys NEW`, or `repo rotate` again) must re-sign them. They must not
re-sign anything else the old keys signed: a rotation is often made because those keys leaked, and whoever holds them
and can write the repository folder would have the publisher's new keys sign their targets.

So before it writes the new root, `rotate` records in the NEW keys' folder (private, never part of the repository)
the repository it rotates and the sha256 of each role file as it verified them; the finishing commands accept a
role signed by an earlier root's keys only when its bytes are exactly those, and the record is removed once every
role is signed by the new keys. This module only reads and writes that record; the checking is
`localpers.bundle.repository_check`'s.
"""

from __future__ import annotations

import json
from pathlib import Path

from localpers.atomic import atomic_write_text
from localpers.errors import InputError

PENDING_FILE = "rotation-pending.json"
ROLE_FILES = ("targets.json", "snapshot.json", "timestamp.json")


def record_pending(keys_dir: Path, repo_dir: Path, hashes: dict[str, str]) -> None:
    """Record, in `keys_dir`, that a rotation of `repo_dir` to these keys is under way with these role files."""
    rotations = _read(keys_dir)
    rotations[str(Path(repo_dir).resolve())] = hashes
    _write(keys_dir, rotations)


def pending_role_files(keys_dir: Path, repo_dir: Path) -> dict[str, str]:
    """The role files (name -> sha256) a rotation of `repo_dir` to the keys in `keys_dir` left signed by the old
    keys; empty when no such rotation is under way."""
    return dict(_read(keys_dir).get(str(Path(repo_dir).resolve()), {}))


def clear_pending(keys_dir: Path, repo_dir: Path) -> None:
    """Forget the rotation of `repo_dir` once every role is signed by these keys (another repository's, still under
    way, stays recorded)."""
    rotations = _read(keys_dir)
    if rotations.pop(str(Path(repo_dir).resolve()), None) is None:
        return
    if rotations:
        _write(keys_dir, rotations)
    else:
        (Path(keys_dir) / PENDING_FILE).unlink(missing_ok=True)


def _read(keys_dir: Path) -> dict[str, dict[str, str]]:
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
    if not isinstance(rotations, dict) or not all(
        isinstance(files, dict)
        and all(name in ROLE_FILES and isinstance(digest, str) for name, digest in files.items())
        for files in rotations.values()
    ):
        raise InputError(
            f"{path}: field 'rotations' is not a map of repositories to role files' sha256; {fix}"
        )
    return rotations


def _write(keys_dir: Path, rotations: dict[str, dict[str, str]]) -> None:
    atomic_write_text(Path(keys_dir) / PENDING_FILE, json.dumps({"rotations": rotations}, indent=1) + "\n")
