"""A bundle manifest's rules, checked on its bytes alone: format, version, paths, hashes, sizes, limits.

`parse_manifest` reads untrusted bytes into a JSON object (duplicate keys and oversize refused);
`validate_manifest` checks every field against docs/BUNDLE.md and `path_problem` says why a path is
unsafe. Each refusal is a one-line `InputError` naming the field (a `BundleProblem` where what to do depends on
where the bundle came from: callers add that with `advising`). Nothing here touches the disk or the
network: checking the listed files against the manifest, and opening a bundle, is
`localpers.bundle.format`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

from localpers.errors import InputError
from localpers.untrusted import JSONProblem, parse_json, reject_duplicate_keys

FORMAT = "localpers-bundle"
FORMAT_VERSION = 1
SUPPORTED_FORMAT_VERSIONS = (1,)
MANIFEST_NAME = "manifest.json"
MAX_MANIFEST_BYTES = 16 << 20  # a manifest is a few KB; anything this big is not one
# The demo bundle is 59 MB and a backbone 250 MB: a manifest declaring more than this is refused before
# anything is downloaded, whatever a server sends (a TUF target length caps each download again).
MAX_BUNDLE_BYTES = 4 << 30
MAX_BUNDLE_FILES = 4096

_SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")
# Characters never allowed in a bundle path: backslash, colon (Windows drives and streams), controls.
_FORBIDDEN_PATH_CHARS = re.compile(r"[\\:\x00-\x1f\x7f]")
# A signed repository serves each file at a URL made of its name as it is: these would end or change it there
_URL_CHARS = re.compile(r"[#?%\s]|[^\x00-\x7f]")

# Sections that are objects when present (docs/BUNDLE.md); `clusters`, `head` and `adapters` are checked with
# the paths they name.
OBJECT_SECTIONS = ("backbone", "encoder", "prompt", "lora", "data_card", "training")


class BundleProblem(InputError):
    """A bundle's manifest or files are wrong (exit code 2). The message says what is wrong; the caller, which
    knows where the bundle came from (pulled, given as a directory, about to be signed), adds what to do
    (`advising`)."""


@contextlib.contextmanager
def advising(advice: str) -> Iterator[None]:
    """Add `advice` to a `BundleProblem` raised inside (once: what leaves is a plain `InputError`)."""
    try:
        yield
    except BundleProblem as exc:
        raise InputError(f"{exc}; {advice}") from None


def path_problem(relative: object) -> str | None:
    """Why `relative` is not a safe bundle path (rule 2 of docs/BUNDLE.md), or None if it is."""
    if not isinstance(relative, str) or not relative:
        return "it is not a non-empty string"
    if relative.startswith("/"):
        return "it is absolute"
    if _FORBIDDEN_PATH_CHARS.search(relative):
        return "it contains a backslash, colon or control character"
    if _URL_CHARS.search(relative):
        return (
            "it contains '#', '?', '%', white space or a non-ASCII letter, which a repository's URL for it cannot"
            " carry"
        )
    parts = relative.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "it has an empty, '.' or '..' component"
    if relative == MANIFEST_NAME:
        return "manifest.json cannot list itself"
    return None


def parse_manifest(data: bytes, origin: str) -> dict[str, Any]:
    """Parse manifest bytes (from `origin`, used in messages) into a dict; no validation beyond JSON."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise BundleProblem(f"{origin}: {len(data)} bytes is too large for a manifest; this is not a bundle")
    try:
        manifest = parse_json(data, object_pairs_hook=reject_duplicate_keys)
    except JSONProblem as exc:
        raise BundleProblem(f"{origin}: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise BundleProblem(f"{origin}: the manifest is not a JSON object")
    return manifest


def _referenced_paths(manifest: dict[str, Any], origin: str) -> dict[str, object]:
    """Every file the manifest refers to outside `files`, keyed by the field that names it."""
    references: dict[str, object] = {}
    adapters = manifest.get("adapters")
    if adapters is not None:
        if not isinstance(adapters, dict):
            raise BundleProblem(f"{origin}: field 'adapters' must be an object of name -> path")
        for name, value in adapters.items():
            references[f"adapters.{name}"] = value
    for section, key in (("clusters", "centroids"), ("head", "file")):
        block = manifest.get(section)
        if block is None:
            continue
        if not isinstance(block, dict):
            raise BundleProblem(f"{origin}: field '{section}' must be an object")
        if key in block:
            references[f"{section}.{key}"] = block[key]
    return references


def _check_paths_do_not_collide(paths: list[str], origin: str) -> None:
    """Refuse a path that is also another path's directory, or two paths equal but for letter case
    (they would overwrite each other on case-insensitive file systems)."""
    directories = {
        "/".join(parts[:end]) for parts in (p.split("/") for p in paths) for end in range(1, len(parts))
    }
    folded: dict[str, str] = {}
    for relative in paths:
        if relative in directories:
            raise BundleProblem(
                f"{origin}: refusing file path {relative!r}: it is also a directory of another listed path"
            )
        other = folded.setdefault(relative.casefold(), relative)
        if other != relative:
            raise BundleProblem(
                f"{origin}: refusing file path {relative!r}: it differs from {other!r} only in letter case"
            )


def validate_manifest(
    manifest: dict[str, Any], *, origin: str = MANIFEST_NAME, backbone_sha256: str | None = None
) -> None:
    """Enforce rules 1, 2 and 4 of docs/BUNDLE.md on a parsed manifest, without touching any file.

    `origin` names the manifest in messages. `backbone_sha256`, when given, must equal the
    manifest's `backbone.sha256`.
    """
    fmt = manifest.get("format")
    if fmt != FORMAT:
        raise BundleProblem(
            f"{origin}: field 'format' is {fmt!r}, not {FORMAT!r}; this is not a localpers bundle"
        )
    version = manifest.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise BundleProblem(f"{origin}: field 'format_version' is {version!r}, not an integer")
    if version not in SUPPORTED_FORMAT_VERSIONS:
        known = ", ".join(map(str, SUPPORTED_FORMAT_VERSIONS))
        advice = "upgrade localpers" if version > max(SUPPORTED_FORMAT_VERSIONS) else "re-publish the bundle"
        raise InputError(
            f"{origin}: bundle format version {version} is not supported by this localpers (knows {known}); {advice}"
        )

    backbone = manifest.get("backbone")
    bundle_backbone = backbone.get("sha256") if isinstance(backbone, dict) else None
    if not isinstance(bundle_backbone, str) or not _SHA256_PATTERN.fullmatch(bundle_backbone):
        raise BundleProblem(f"{origin}: field 'backbone.sha256' is missing or not a lowercase hex sha256")

    for section in OBJECT_SECTIONS:
        block = manifest.get(section)
        if block is not None and not isinstance(block, dict):
            raise BundleProblem(f"{origin}: field '{section}' must be an object, not {type(block).__name__}")

    files = manifest.get("files")
    if not isinstance(files, dict):
        raise BundleProblem(f"{origin}: field 'files' is missing or not an object")
    for relative, entry in files.items():
        problem = path_problem(relative)
        if problem:
            raise BundleProblem(f"{origin}: refusing file path {relative!r} in 'files': {problem}")
        if not isinstance(entry, dict):
            raise BundleProblem(f"{origin}: files[{relative!r}] must be an object with sha256 and size")
        digest, size = entry.get("sha256"), entry.get("size")
        if not isinstance(digest, str) or not _SHA256_PATTERN.fullmatch(digest):
            raise BundleProblem(f"{origin}: files[{relative!r}].sha256 is not a lowercase hex sha256")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BundleProblem(f"{origin}: files[{relative!r}].size is not a non-negative integer")

    if len(files) > MAX_BUNDLE_FILES:
        raise BundleProblem(
            f"{origin}: field 'files' lists {len(files)} files, more than the {MAX_BUNDLE_FILES} a bundle may have"
        )
    total = sum(entry["size"] for entry in files.values())
    if total > MAX_BUNDLE_BYTES:
        raise BundleProblem(
            f"{origin}: field 'files' adds up to {total} bytes, more than the {MAX_BUNDLE_BYTES} a bundle may"
            " have; this is not a bundle localpers will download"
        )
    _check_paths_do_not_collide(list(files), origin)

    for field, relative in _referenced_paths(manifest, origin).items():
        problem = path_problem(relative)
        if problem:
            raise BundleProblem(f"{origin}: refusing path {relative!r} in field '{field}': {problem}")
        if relative not in files:
            raise BundleProblem(
                f"{origin}: field '{field}' names {relative!r}, which is not listed in 'files'"
            )

    if backbone_sha256 is not None and bundle_backbone != backbone_sha256.lower():
        name = backbone.get("name", "an unnamed backbone") if isinstance(backbone, dict) else "?"
        raise InputError(
            f"{origin}: the bundle was built for backbone {name} with sha256 {bundle_backbone}, but the backbone"
            f" in use has sha256 {backbone_sha256}; use that backbone (--model / LOCALPERS_MODEL) or pull a"
            " bundle built for yours"
        )
