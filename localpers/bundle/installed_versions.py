"""The installed versions of pulled bundles under cache_dir()/bundles: each new one's name, the `current` pointer
switched to it with one atomic rename, and the older versions pruned (with their records).

What a version holds and how it is checked is `localpers.bundle.format`'s and `localpers.bundle.record`'s; the
transaction that stages and installs one is `localpers.bundle.pull`'s. Nothing here opens a network connection.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

from localpers.bundle.format import write_bytes_atomically
from localpers.bundle.locations import CURRENT_FILE, CURRENT_LINK, VERSIONS_DIR
from localpers.bundle.record import RECORD_SUFFIX
from localpers.bundle.version_use import IN_USE_SUFFIX, is_in_use


def new_version_name(versions: Path, manifest_bytes: bytes) -> str:
    """A new version's folder name: the UTC time and the manifest's hash, numbered if that name is taken."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    base = f"{stamp}-{hashlib.sha256(manifest_bytes).hexdigest()[:12]}"
    name, counter = base, 1
    while (versions / name).exists():
        counter += 1
        name = f"{base}-{counter}"
    return name


def switch_current(root: Path, version: str) -> None:
    """Point `current` at versions/<version> with one atomic rename (a symlink, else current.json)."""
    link = root / CURRENT_LINK
    temporary = root / f".current-{os.getpid()}-{time.monotonic_ns()}"
    try:
        os.symlink(Path(VERSIONS_DIR) / version, temporary, target_is_directory=True)
    except (OSError, NotImplementedError):
        # No symlinks here (e.g. Windows without developer mode): an atomically replaced pointer file.
        write_bytes_atomically(root / CURRENT_FILE, json.dumps({"version": version}).encode())
        if link.is_symlink():
            link.unlink()
        return
    try:
        os.replace(temporary, link)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise
    (root / CURRENT_FILE).unlink(missing_ok=True)


def prune_versions(versions: Path, keep: set[str]) -> None:
    """Delete installed versions except `keep` (the new one and the one it replaced) and those a running localpers
    still reads (`version_use`), with their records."""
    kept = set(keep) | {entry.name for entry in versions.iterdir() if entry.is_dir() and is_in_use(entry)}
    for entry in versions.iterdir():
        if entry.name.removesuffix(RECORD_SUFFIX).removesuffix(IN_USE_SUFFIX) in kept:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
