"""Where bundles live on this device: the pulled versions under cache_dir()/bundles with their `current` pointer,
and the demo bundle shipped inside the package.

It finds folders only: it never verifies, opens or writes a bundle (`localpers.bundle.format` verifies and opens
one, `localpers.bundle.installed_versions` switches `current` and prunes versions) and never opens a network
connection.
"""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

from localpers.bundle.manifest import path_problem
from localpers.errors import LocalpersError
from localpers.paths import cache_dir
from localpers.regular_files import read_regular_file
from localpers.untrusted import JSONProblem, parse_json


def bundles_root(*, create: bool = True) -> Path:
    """cache_dir()/bundles: pulled versions, the `current` pointer and pull staging directories (not created with
    `create=False`)."""
    path = cache_dir(create=create) / "bundles"
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


CURRENT_LINK = "current"  # a symlink to versions/<id>
CURRENT_FILE = "current.json"  # fallback pointer where symlinks cannot be made: {"version": "<id>"}
VERSIONS_DIR = "versions"
POINTER_LIMIT = 64 << 10  # current.json is a few dozen bytes


def installed_bundle_dir(*, strict: bool = False) -> Path | None:
    """The directory of the pulled bundle `current` points to, or None when nothing was pulled.

    A `current` link or `current.json` that names a missing or unreadable version is None, or with
    `strict` a one-line error saying so (the device must not silently fall back to the demo bundle).
    """
    root = bundles_root()
    link = root / CURRENT_LINK
    fix = f"run `localpers pull URL` again, or delete {link} to use the embedded demo bundle"
    if link.is_symlink() or link.is_dir():
        if link.is_dir():
            return link.resolve()
        if strict:
            raise LocalpersError(f"{link} points to {os.readlink(link)}, which is missing; {fix}")
        return None
    pointer = root / CURRENT_FILE
    if not pointer.exists() and not pointer.is_symlink():
        return None
    try:  # a regular file only: a FIFO there hung every command
        version = parse_json(read_regular_file(pointer, POINTER_LIMIT, what="pointer", stored=True)).get(
            "version"
        )
    except (LocalpersError, JSONProblem, AttributeError):
        version = None
    candidate = None
    if isinstance(version, str) and path_problem(version) is None and "/" not in version:
        candidate = root / VERSIONS_DIR / version
    if candidate is not None and candidate.is_dir():
        return candidate
    if strict:
        raise LocalpersError(f"{pointer} names a bundle version that is missing or unreadable; {fix}")
    return None


def pulled_version(directory: Path) -> Path | None:
    """`versions/<id>` when `directory` is (or links to) a version `pull` installed, else None."""
    versions = bundles_root(create=False) / VERSIONS_DIR
    try:
        resolved = directory.resolve()
        return resolved if resolved.parent == versions.resolve() else None
    except (OSError, RuntimeError):
        return None


def embedded_bundle_dir() -> Path:
    """Where the demo bundle shipped inside the package lives (it may not exist)."""
    try:
        return Path(str(importlib.resources.files("localpers.models"))) / "demo-bundle"
    except ModuleNotFoundError:
        # Running from a source checkout: the `localpers.models` package is the repository's models/.
        return Path(__file__).resolve().parents[2] / "models" / "demo-bundle"
