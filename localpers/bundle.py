"""Bundle manifests: hashing files and writing `manifest.json` (format in docs/BUNDLE.md).

This minimal version only writes manifests; verification, opening and pulling are added by the
bundle work (see docs/BUNDLE.md for the rules a device enforces).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

FORMAT = "localpers-bundle"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"


def sha256_of_file(path: Path, chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while block := handle.read(chunk_size):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(bundle_dir: Path, manifest: dict[str, Any]) -> Path:
    """Fill `manifest["files"]` with every file's sha256 and size, then write manifest.json atomically."""
    bundle_dir = Path(bundle_dir)
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in bundle_dir.rglob("*") if p.is_file()):
        relative = path.relative_to(bundle_dir).as_posix()
        if relative == MANIFEST_NAME or relative.endswith(".partial"):
            continue
        files[relative] = {"sha256": sha256_of_file(path), "size": path.stat().st_size}
    complete = {"format": FORMAT, "format_version": FORMAT_VERSION, **manifest, "files": files}
    target = bundle_dir / MANIFEST_NAME
    partial = target.with_name(target.name + ".partial")
    partial.write_text(json.dumps(complete, indent=2, sort_keys=False) + "\n")
    os.replace(partial, target)
    return target
