"""The downloads of `localpers pull` and the checks on either side of them, the steps that fill and check the
staging directory of the install transaction in `localpers.bundle.pull`.

What it does: `check_free_space` refuses a bundle the disk cannot hold before any of it is downloaded;
`fetch_file` streams one listed file of a plain bundle directory into the staging directory, refusing it as soon
as its size or sha256 is wrong; `pull_backbone` installs the backbone a signed repository carries
(`--with-backbone`, resuming); `check_staged` runs the caller's content check on the staged bundle, its errors
naming the source's files rather than the staging directory.

What it does not do: take the pull lock, make or remove the staging directory, name a version, switch `current`
or prune (`localpers.bundle.pull` and `localpers.bundle.installed_versions`); choose or open a source
(`localpers.bundle.sources`); download a signed target, whose length and sha256 TUF checks
(`localpers.bundle.signed`); or decide which publisher may replace the bundle in use
(`localpers.bundle.pull_publisher`). It never loads what it downloads.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from localpers.bundle.format import CHUNK_SIZE, Bundle, BundleProblem
from localpers.bundle.signed import SignedSource
from localpers.bundle.sources import BundleSource
from localpers.errors import LocalpersError

# (file being fetched, bytes fetched so far over all files, total bytes of all files)
ProgressCallback = Callable[[str, int, int], None]


def fetch_file(
    source: BundleSource,
    relative: str,
    entry: dict,
    staging: Path,
    progress: Callable[[int], None],
) -> None:
    """Stream one listed file into `staging`, refusing it as soon as its size or sha256 is wrong."""
    expected_size: int = entry["size"]
    where = source.where(relative)
    target = staging / relative
    digest = hashlib.sha256()
    received = 0
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        out = target.open("wb")
    except OSError as exc:
        raise LocalpersError(
            f"{relative}: cannot be written into the staging directory {staging} ({exc})"
        ) from None
    with source.open_file(relative) as stream, out:
        while True:
            try:
                block = stream.read(min(CHUNK_SIZE, expected_size + 1 - received))
            except (OSError, http.client.HTTPException) as exc:
                raise LocalpersError(
                    f"{where}: download failed after {received} bytes ({exc}); try again"
                ) from None
            if not block:
                break
            received += len(block)
            if received > expected_size:
                raise BundleProblem(
                    f"{relative}: the source sends more than the {expected_size} bytes the manifest lists;"
                    f" refusing the bundle from {source.description}"
                )
            digest.update(block)
            try:
                out.write(block)
            except OSError as exc:
                raise LocalpersError(
                    f"{relative}: writing into {staging} failed ({exc}); free some space and pull again"
                ) from None
            progress(len(block))
        out.flush()
        os.fsync(out.fileno())
    if received != expected_size:
        raise BundleProblem(
            f"{relative}: got {received} bytes from {where}, the manifest lists {expected_size};"
            " the file is cut short or not the one the manifest lists"
        )
    if digest.hexdigest() != entry["sha256"]:
        raise BundleProblem(
            f"{relative}: sha256 of the downloaded file is {digest.hexdigest()}, the manifest says"
            f" {entry['sha256']}; the file at {where} is damaged or was tampered with"
        )


def check_free_space(root: Path, needed: int, largest: int = 0) -> None:
    """Refuse a bundle that would not fit on the disk, before downloading any of it: all of it in `root`, and (a
    signed pull, which python-tuf stages file by file in the temporary folder first) its `largest` file there."""
    places = [(root, needed)]
    if largest:
        temporary = Path(tempfile.gettempdir())
        try:
            shared = os.stat(temporary).st_dev == os.stat(root).st_dev
        except OSError:
            shared = False
        # one disk holds both the staged file and the bundle: the largest file twice at its peak
        places = [(root, needed + largest)] if shared else [*places, (temporary, largest)]
    for place, wanted in places:
        try:
            free = shutil.disk_usage(place).free
        except OSError:
            continue
        if wanted > free:
            raise LocalpersError(
                f"the bundle needs {wanted} bytes in {place} but it has {free} free; free some space and pull"
                " again"
            )


def pull_backbone(
    source: BundleSource | SignedSource,
    manifest: dict,
    current: list[str],
    on_progress: ProgressCallback | None,
) -> str:
    """Install the backbone the manifest names from the signed repository (resuming); returns its sha256."""
    from localpers.engine.backbone import cached_sha256, pulled_backbone_path

    if not isinstance(source, SignedSource):
        raise LocalpersError("--with-backbone needs a signed repository; a plain bundle does not carry one")
    sha256 = manifest["backbone"]["sha256"]
    destination = pulled_backbone_path(sha256)
    if not (destination.is_file() and cached_sha256(destination) == sha256):
        current[:] = [f"backbone/{sha256[:12]}.gguf"]
        if on_progress:
            on_progress(current[0], 0, 0)
        source.download_backbone(sha256, destination)
        current.clear()
        cached_sha256(destination)
    return sha256


def check_staged(
    staged: Bundle,
    source: BundleSource | SignedSource,
    check_content: Callable[[Bundle, str], None],
    backbone_sha256: str,
) -> None:
    """Run the caller's content check; its errors name the source's files, not the staging directory."""
    try:
        check_content(staged, backbone_sha256)
    except LocalpersError as exc:
        staging = re.escape(str(staged.directory))
        message = re.sub(staging + r"/([^\s:;,]+)", lambda match: source.where(match.group(1)), str(exc))
        message = re.sub(staging, lambda _: source.description, message) + " (nothing was installed)"
        if isinstance(exc, BundleProblem):  # the bundle's content: the pull adds what to do about it
            raise BundleProblem(message) from exc
        raise LocalpersError(message, exit_code=exc.exit_code) from exc
