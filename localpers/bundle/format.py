"""Bundles on disk: write a manifest, verify a bundle's files against every rule in docs/BUNDLE.md, open it.

A bundle is a directory whose `manifest.json` names and hashes every other file. `write_manifest`
is the publisher's half; `verify_bundle` / `open_bundle` are the device's half and refuse a bundle
(with a `LocalpersError` naming the file or field) before anything in it is loaded. The manifest's own
rules (on its bytes alone) are `localpers.bundle.manifest`, whose names are importable from here too. This module
reads local files only: it never opens a network connection (see `localpers.bundle.pull`) and never
loads adapters, heads or centroids (it only hands out their verified paths).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localpers.atomic import atomic_write_bytes as write_bytes_atomically
from localpers.bundle.locations import embedded_bundle_dir, installed_bundle_dir, pulled_version
from localpers.bundle.manifest import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    BundleProblem,
    advising,
    parse_manifest,
    path_problem,
    validate_manifest,
)
from localpers.bundle.record import check_installed_manifest, pull_command
from localpers.bundle.version_use import hold_version
from localpers.errors import InputError, LocalpersError, StorageError
from localpers.paths import expand_user
from localpers.regular_files import open_regular_file, read_regular_file
from localpers.strict_json import strict_json_text

__all__ = [
    "FORMAT",
    "BundleProblem",
    "advising",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "MAX_MANIFEST_BYTES",
    "Bundle",
    "open_bundle",
    "reading_bundle",
    "repair_advice",
    "parse_manifest",
    "path_problem",
    "validate_manifest",
    "verify_bundle",
    "write_manifest",
]

PARTIAL_SUFFIX = ".partial"
# What to do about a bundle directory the user gave (a copy, a publisher's output) that is refused.
GIVEN_BUNDLE_ADVICE = "copy the bundle directory again from its publisher, or re-publish it"
# ... and a folder that holds no manifest at all, most likely not the one meant
NOT_A_BUNDLE = (
    "give the folder that holds the bundle's manifest.json (a signed repository's folder holds metadata/ and"
    " targets/ instead)"
)
# ... and one a publisher is about to sign.
PUBLISH_ADVICE = "build it again (`localpers publish`) or copy it again before signing it"
CHUNK_SIZE = 1 << 20
# --------------------------------------------------------------------------------------------------
# Writing (publisher side)


def sha256_of_file(path: Path, chunk_size: int = CHUNK_SIZE) -> str:
    """Hex sha256 of a regular file, read in 1 MiB chunks; an OSError (EINVAL) for anything else.

    Opened without blocking: its callers check for a regular file first, but a FIFO swapped in after that check
    would have held the command forever, waiting for a writer.
    """
    digest = hashlib.sha256()
    with open_regular_file(Path(path)) as handle:
        while block := handle.read(chunk_size):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(bundle_dir: Path, manifest: dict[str, Any]) -> Path:
    """Fill `manifest["files"]` with every file's sha256 and size, then write manifest.json atomically.

    Every regular file under `bundle_dir` is listed (posix relative paths, sorted) except
    `manifest.json` itself and `*.partial` files (half-written outputs). `format` and
    `format_version` default to this build's. Returns the path of the manifest written.
    """
    bundle_dir = Path(bundle_dir)
    if not bundle_dir.is_dir():
        raise LocalpersError(
            f"bundle directory {bundle_dir} does not exist; create it and write its files first"
        )
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(bundle_dir.rglob("*"), key=lambda p: p.relative_to(bundle_dir).as_posix()):
        if path.is_symlink() or not path.is_file():
            continue
        relative = path.relative_to(bundle_dir).as_posix()
        if relative == MANIFEST_NAME or relative.endswith(PARTIAL_SUFFIX):
            continue
        problem = path_problem(relative)
        if problem:
            raise LocalpersError(f"{path}: cannot be part of a bundle: {problem}; rename the file")
        files[relative] = {"sha256": sha256_of_file(path), "size": path.stat().st_size}
    manifest["files"] = files
    complete = {"format": FORMAT, "format_version": FORMAT_VERSION, **manifest}
    target = bundle_dir / MANIFEST_NAME
    # Strict JSON: a loss nothing was measured on (no validation items) is null, not a bare NaN.
    write_bytes_atomically(target, (strict_json_text(complete, indent=2, ensure_ascii=True) + "\n").encode())
    # the atomic write's temp file is 0600: a bundle is published content, as readable as the umask lets the
    # files copied beside it be
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(target, 0o666 & ~mask)
    return target


# --------------------------------------------------------------------------------------------------
# Checking files on disk


def check_file(bundle_dir: Path, relative: str, entry: dict[str, Any]) -> None:
    """Rule 2 (resolves inside) and rule 3 (exists, size, sha256) for one listed file."""
    root = bundle_dir.resolve()
    path = bundle_dir / relative
    where = f"bundle {bundle_dir}: {relative}"
    try:
        resolved = path.resolve()
        info = path.stat()
    except FileNotFoundError:
        raise BundleProblem(f"{where}: listed in the manifest but missing") from None
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Python < 3.13)
        raise BundleProblem(f"{where}: cannot be read ({exc})") from None
    if not resolved.is_relative_to(root):
        raise BundleProblem(f"{where}: resolves outside the bundle (to {resolved}); refusing it")
    if not stat.S_ISREG(info.st_mode):
        raise BundleProblem(f"{where}: is not a regular file")
    if info.st_size != entry["size"]:
        raise BundleProblem(
            f"{where}: size is {info.st_size} bytes, the manifest says {entry['size']};"
            " the file is damaged or was tampered with"
        )
    try:
        digest = sha256_of_file(path)
    except OSError as exc:  # unreadable, or no longer a regular file (swapped since the check above)
        raise BundleProblem(f"{where}: cannot be read ({exc.strerror or exc})") from None
    if digest != entry["sha256"]:
        raise BundleProblem(
            f"{where}: sha256 is {digest}, the manifest says {entry['sha256']};"
            " the file is damaged or was tampered with"
        )


def read_manifest(bundle_dir: Path) -> dict[str, Any]:
    """Read and parse `bundle_dir/manifest.json` (no validation beyond JSON)."""
    path = Path(bundle_dir) / MANIFEST_NAME
    if not path.exists() and not path.is_symlink():
        raise BundleProblem(f"{bundle_dir}: no manifest.json there, so it is not a bundle directory")
    # a regular file only: opened blocking, a FIFO there hung every command that opened the bundle
    too_big = "this is not a bundle"
    try:
        data = read_regular_file(
            path, MAX_MANIFEST_BYTES, what="bundle manifest", stored=True, too_big=too_big
        )
    except BundleProblem:
        raise
    except (
        InputError
    ) as exc:  # too large: a fault of the bundle, to which callers add what to do (`advising`)
        raise BundleProblem(str(exc)) from None
    return parse_manifest(data, str(path))


@dataclass(frozen=True)
class Bundle:
    """A verified bundle on disk: its directory and parsed manifest, with paths to its parts."""

    directory: Path
    manifest: dict[str, Any]

    def _file(self, field: str, relative: object) -> Path:
        if not isinstance(relative, str):
            raise BundleProblem(
                f"bundle {self.directory}: manifest field '{field}' is missing; the bundle is incomplete"
            )
        return self.directory / relative

    @property
    def adapter_names(self) -> list[str]:
        """Adapter names in manifest order: "global", "cluster-0", ..."""
        return list(self.manifest.get("adapters") or {})

    def adapter_path(self, name: str) -> Path:
        """The GGUF LoRA file of adapter `name` ("global", "cluster-0", ...)."""
        adapters = self.manifest.get("adapters") or {}
        if name not in adapters:
            known = ", ".join(adapters) or "none"
            raise LocalpersError(f"bundle {self.directory} has no adapter {name!r} (it has: {known})")
        return self._file(f"adapters.{name}", adapters[name])

    def cluster_adapter_name(self, cluster: int) -> str:
        """The adapter name of cluster `cluster` (0 <= cluster < k)."""
        if not 0 <= cluster < self.k:
            raise LocalpersError(f"cluster {cluster} is out of range: bundle {self.directory} has k={self.k}")
        return f"cluster-{cluster}"

    def check_cluster_adapters(self) -> None:
        """Refuse a bundle whose `adapters` lack one of its k clusters' (found before any user meets the gap)."""
        wanted = [self.cluster_adapter_name(c) for c in range(self.k)]
        missing = [name for name in wanted if name not in self.adapter_names]
        if missing:
            raise BundleProblem(
                f"bundle {self.directory}: manifest field 'clusters.k' is {self.k}, but 'adapters' has no"
                f" {', '.join(missing)}"
            )

    @property
    def head_path(self) -> Path:
        return self._file("head.file", (self.manifest.get("head") or {}).get("file"))

    @property
    def centroids_path(self) -> Path:
        return self._file("clusters.centroids", (self.manifest.get("clusters") or {}).get("centroids"))

    @property
    def k(self) -> int:
        value = (self.manifest.get("clusters") or {}).get("k")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BundleProblem(
                f"bundle {self.directory}: manifest field 'clusters.k' is missing or not >= 1"
            )
        return value

    @property
    def backbone_sha256(self) -> str:
        return str(self.manifest["backbone"]["sha256"])

    @property
    def total_size(self) -> int:
        return sum(entry["size"] for entry in self.manifest["files"].values())


def verify_bundle(bundle_dir: Path, *, backbone_sha256: str | None = None) -> Bundle:
    """Check a bundle directory against every rule in docs/BUNDLE.md; return it or raise LocalpersError.

    The manifest is checked first (format, paths, references, backbone), then each listed file's
    location, size and sha256 in manifest order; the first failure is raised, naming the file.
    """
    bundle_dir = Path(bundle_dir)
    manifest = read_manifest(bundle_dir)
    validate_manifest(manifest, origin=str(bundle_dir / MANIFEST_NAME), backbone_sha256=backbone_sha256)
    for relative, entry in manifest["files"].items():
        check_file(bundle_dir, relative, entry)
    return Bundle(directory=bundle_dir, manifest=manifest)


# --------------------------------------------------------------------------------------------------
# The bundle commands use (where bundles live is `localpers.bundle.locations`)


def installed_bundle_with(manifest_bytes: bytes, backbone_sha256: str | None) -> Path | None:
    """The installed bundle if its manifest is exactly `manifest_bytes` and its files still verify, else None.

    `localpers pull` asks this before downloading: the same bundle again would be a copy of it (and push out
    the distinct bundle kept before it); a damaged installed copy (a file edited or missing) is None.
    """
    installed = installed_bundle_dir()
    if installed is None:
        return None
    try:
        installed_manifest = read_regular_file(
            installed / MANIFEST_NAME, MAX_MANIFEST_BYTES, what="bundle manifest", stored=True
        )
        if installed_manifest != manifest_bytes:
            return None
        verify_bundle(installed, backbone_sha256=backbone_sha256)
    except (OSError, LocalpersError):
        return None
    return installed


def default_bundle_dir() -> Path:
    """The pulled bundle if there is one, else the embedded demo bundle's directory (may not exist)."""
    return installed_bundle_dir(strict=True) or embedded_bundle_dir()


def bundle_in_use_sha256() -> str | None:
    """The sha256 of the manifest of the bundle commands use now (what a user's fit records), without verifying
    or loading it; None when there is none to read."""
    try:
        return sha256_of_file(default_bundle_dir() / "manifest.json")
    except (OSError, LocalpersError):
        return None


def repair_advice(directory: Path) -> str:
    """What to do about a bad file in the bundle at `directory`, for where it came from: the pulled bundle is
    pulled again (from its recorded source), the embedded demo bundle comes with a reinstall, any other
    directory (`--bundle DIR`) is copied again or re-published."""
    resolved = Path(directory).resolve()
    installed = installed_bundle_dir()
    if installed is not None and installed.resolve() == resolved:
        return f"pull it again with `{pull_command(installed)}`"
    if embedded_bundle_dir().resolve() == resolved:
        return "the demo bundle shipped with localpers is damaged: reinstall localpers"
    return GIVEN_BUNDLE_ADVICE


@contextlib.contextmanager
def reading_bundle(bundle: Bundle) -> Iterator[None]:
    """Around code that reads `bundle`'s files (manifest entries, adapters, head, centroids): a refusal raised
    inside leaves as one line with what to do for where the bundle came from (`repair_advice`), exit code 2.
    A file that could not be written (`StorageError`) is not the bundle's fault and leaves unchanged."""
    try:
        yield
    except StorageError:
        raise
    except LocalpersError as exc:
        raise InputError(f"{exc}; {repair_advice(bundle.directory)}") from None


def check_given_bundle_dir(directory: Path) -> None:
    """Refuse a folder given as a bundle that holds no manifest.json: most likely another folder than meant (a
    repository, a parent), so the advice is which folder to give, not to copy the bundle again."""
    if not (directory / MANIFEST_NAME).exists():
        raise InputError(
            f"{directory}: no manifest.json there, so it is not a bundle directory; {NOT_A_BUNDLE}"
        )


def open_bundle(path: Path | str | None = None, backbone_sha256: str | None = None) -> Bundle:
    """Verify and return the bundle at `path` (default: `default_bundle_dir()`; a pulled version's manifest, the
    default one or one named by path, must still be the one `pull` recorded). A refusal says what to do for where
    the bundle came from."""
    if path is not None:
        directory = expand_user(path)
        if not directory.is_dir():
            raise InputError(
                f"{directory}: no such directory; give a bundle directory (one with a manifest.json)"
            )
        pulled = pulled_version(directory)
        if pulled is not None:
            # a pulled version given by its path, often `bundles/current`, which the next pull moves on: the
            # version itself is read and held as the default bundle is (through the link, this process read
            # another version's files beside those it had verified, and a pull could prune the one it verified)
            directory = pulled
            check_installed_manifest(directory)  # its record sits beside it, current or kept
            hold_version(directory)
        if repair_advice(directory) == GIVEN_BUNDLE_ADVICE:  # neither the pulled bundle nor the demo's
            check_given_bundle_dir(directory)
        with advising(repair_advice(directory)):
            return verify_bundle(directory, backbone_sha256=backbone_sha256)
    installed = installed_bundle_dir(strict=True)
    if installed is None:
        directory = embedded_bundle_dir()
        if not (directory / MANIFEST_NAME).is_file():
            raise LocalpersError(
                f"no bundle installed (looked in {directory}): run `localpers pull URL` with the address of a"
                " signed repository (`localpers repo`), or give a bundle directory"
            )
        with advising(repair_advice(directory)):
            return verify_bundle(directory, backbone_sha256=backbone_sha256)
    check_installed_manifest(installed)
    hold_version(installed)  # kept by the next pulls while this process may still read it
    with advising(repair_advice(installed)):
        return verify_bundle(installed, backbone_sha256=backbone_sha256)
