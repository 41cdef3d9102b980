"""The device's side of signed bundle updates: trusted publisher roots and a TUF `Updater` source.

`pull` never trusts what a server says about who signed a repository. It starts from a root this
device already trusts:

- the demo publisher's root, shipped in the package (`localpers/trust/demo-publisher-root.json`);
- a root stored by an earlier pull under `config_dir()/trust/<fingerprint>/` (python-tuf's metadata
  cache: the newest trusted root, timestamp, snapshot and targets, so rollbacks are refused);
- a new publisher's version-1 root, accepted only when its root key's fingerprint equals the one the
  user gave (`localpers pull URL --trust FINGERPRINT`), then stored.

From there `tuf.ngclient.Updater` walks root rotations, refuses expired (freeze), older (rollback) or
mismatched (mix-and-match) metadata, and downloads no target past its signed length (endless data).
`SignedSource` hands the verified bundle files to `localpers.bundle.pull`, which installs them. This module
never loads a bundle; the only connections it makes are the fetches of one explicit pull.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.resources
import shutil
import stat
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from localpers import __version__
from localpers.bundle.repository import BACKBONE_PREFIX, BUNDLE_PREFIX, METADATA_DIR, TARGETS_DIR
from localpers.bundle.transport import HttpOnlyRedirects, is_loopback
from localpers.errors import InputError, LocalpersError
from localpers.paths import config_dir
from localpers.untrusted import one_line

ROOT_MAX_BYTES = 512_000  # python-tuf's own cap on a root file
DEMO_ROOT_RESOURCE = "demo-publisher-root.json"
TRUST_DIR = "trust"
CHUNK = 1 << 20


def demo_root_bytes() -> bytes:
    """The demo publisher's version-1 root metadata, shipped in the package."""
    return (importlib.resources.files("localpers") / "trust" / DEMO_ROOT_RESOURCE).read_bytes()


def root_fingerprint(root_bytes: bytes, origin: str) -> str:
    """The fingerprint (keyid of the first root key) of a root metadata file; InputError if malformed."""
    from tuf.api.metadata import Metadata, Root

    try:
        root = Metadata[Root].from_bytes(root_bytes)
        keyids = sorted(root.signed.roles["root"].keyids)
        if root.signed.type != "root" or not keyids:
            raise ValueError("no root keys")
    except Exception as exc:  # python-tuf raises several types for malformed metadata
        raise InputError(f"{origin}: not valid TUF root metadata ({_reason(exc)})") from None
    return keyids[0]


def _reason(exc: BaseException) -> str:
    return one_line(f"{type(exc).__name__}: {exc}", 200)


def trust_store(fingerprint: str) -> Path:
    """Where the trusted metadata of the publisher with this root fingerprint lives on this device."""
    return config_dir() / TRUST_DIR / fingerprint


def trusted_fingerprints() -> list[str]:
    root = config_dir() / TRUST_DIR
    return sorted(p.name for p in root.iterdir() if (p / "root.json").exists()) if root.is_dir() else []


# --------------------------------------------------------------------------------------------------
# Fetching: http(s) with the same rules as unsigned pulls, or a local repository directory


class Fetcher:
    """A python-tuf fetcher (subclass built lazily) over http(s) or a local directory, with progress."""

    def __init__(self, timeout: float, on_bytes: Callable[[int], None] | None = None) -> None:
        self.timeout = timeout
        self.on_bytes = on_bytes
        self._redirects = HttpOnlyRedirects
        self._is_loopback = is_loopback

    def chunks(self, url: str) -> Iterator[bytes]:
        from tuf.api.exceptions import DownloadHTTPError

        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme == "file":
            yield from self._file_chunks(Path(urllib.parse.unquote(parsed.path)))
            return
        handlers: list[urllib.request.BaseHandler] = [self._redirects()]
        if parsed.hostname and self._is_loopback(parsed.hostname):
            handlers.append(urllib.request.ProxyHandler({}))
        opener = urllib.request.build_opener(*handlers)
        request = urllib.request.Request(
            url, headers={"User-Agent": f"localpers/{__version__}", "Accept-Encoding": "identity"}
        )
        try:
            response = opener.open(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            raise DownloadHTTPError(f"{url}: HTTP {exc.code}", exc.code) from None
        except urllib.error.URLError as exc:
            raise LocalpersError(
                f"could not reach {url}: {one_line(str(exc.reason), 200)}; check the address and that the"
                " server runs"
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            raise LocalpersError(f"{url}: request failed ({_reason(exc)}); try again") from None
        with response:
            if response.status != 200:
                raise DownloadHTTPError(f"{url}: HTTP {response.status}", response.status)
            while True:
                try:
                    block = response.read(CHUNK)
                except (OSError, http.client.HTTPException) as exc:
                    raise LocalpersError(f"{url}: download failed ({_reason(exc)}); try again") from None
                if not block:
                    break
                if self.on_bytes:
                    self.on_bytes(len(block))
                yield block

    def _file_chunks(self, path: Path) -> Iterator[bytes]:
        from tuf.api.exceptions import DownloadHTTPError

        try:
            info = path.lstat()
        except FileNotFoundError:
            raise DownloadHTTPError(f"{path}: no such file", 404) from None
        if not stat.S_ISREG(info.st_mode):  # no FIFOs, devices or symlinks out of the repository
            raise DownloadHTTPError(f"{path}: not a regular file", 403)
        with path.open("rb") as handle:
            while block := handle.read(CHUNK):
                if self.on_bytes:
                    self.on_bytes(len(block))
                yield block

    def resume_into(self, url: str, partial: Path, length: int) -> None:
        """Append the rest of `url` to `partial` (an HTTP range request from its size), at most `length`
        bytes in all. A server that ignores the range gets the file restarted from byte 0."""
        have = partial.stat().st_size if partial.exists() else 0
        if have > length:
            partial.unlink()
            have = 0
        if have == length:
            return
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme == "file":
            source = Path(urllib.parse.unquote(parsed.path))
            if not source.is_file() or source.is_symlink():
                raise LocalpersError(f"{source}: missing or not a regular file in the repository")
            with source.open("rb") as handle, partial.open("ab") as out:
                handle.seek(have)
                self._copy_capped(handle, out, length - have, url)
            return
        handlers: list[urllib.request.BaseHandler] = [self._redirects()]
        if parsed.hostname and self._is_loopback(parsed.hostname):
            handlers.append(urllib.request.ProxyHandler({}))
        headers = {"User-Agent": f"localpers/{__version__}", "Accept-Encoding": "identity"}
        if have:
            headers["Range"] = f"bytes={have}-"
        try:
            response = urllib.request.build_opener(*handlers).open(
                urllib.request.Request(url, headers=headers), timeout=self.timeout
            )
        except urllib.error.HTTPError as exc:
            raise LocalpersError(f"{url}: HTTP {exc.code}; the repository does not hold this file") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise LocalpersError(f"could not reach {url} ({_reason(exc)}); pull again to resume") from None
        with response:
            resumed = response.status == 206 and str(response.headers.get("Content-Range", "")).startswith(
                f"bytes {have}-"
            )
            mode = "ab" if resumed else "wb"
            remaining = length - have if resumed else length
            with partial.open(mode) as out:
                self._copy_capped(response, out, remaining, url)

    def _copy_capped(self, stream: Any, out: Any, remaining: int, url: str) -> None:
        while True:
            try:
                block = stream.read(min(CHUNK, remaining + 1))
            except (OSError, http.client.HTTPException) as exc:
                raise LocalpersError(
                    f"{url}: download failed ({_reason(exc)}); pull again to resume"
                ) from None
            if not block:
                return
            if len(block) > remaining:
                raise InputError(f"{url}: the server sends more than the signed length; refusing it")
            out.write(block)
            out.flush()
            remaining -= len(block)
            if self.on_bytes:
                self.on_bytes(len(block))

    def as_tuf_fetcher(self) -> Any:
        from tuf.ngclient import FetcherInterface

        outer = self

        class _TufFetcher(FetcherInterface):
            def _fetch(self, url: str) -> Iterator[bytes]:
                return outer.chunks(url)

        return _TufFetcher()


def _repository_base(source: str) -> str:
    """The base URL (ending in /) of a repository given as an http(s) URL or a local directory."""
    if source.startswith(("http://", "https://")):
        parsed = urllib.parse.urlsplit(source)
        if not parsed.hostname:
            raise LocalpersError(f"{source}: not an http(s) URL of a repository")
        path = parsed.path if parsed.path.endswith("/") else parsed.path + "/"
        return urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, path, "", ""))
    if "://" in source:
        raise LocalpersError(f"{source}: only http://, https:// or a local directory can be pulled")
    directory = Path(source).expanduser().resolve()
    if not directory.is_dir():
        raise LocalpersError(f"{source}: no such directory; give a repository directory or an http(s) URL")
    return directory.as_uri() + "/"


def is_signed_repository(source: str) -> bool:
    """A local directory with metadata/1.root.json, or any URL (URLs are always pulled signed)."""
    if "://" in source:
        return True
    return (Path(source).expanduser() / METADATA_DIR / "1.root.json").is_file()


# --------------------------------------------------------------------------------------------------
# Choosing the trusted root


def _fetch_first_root(fetcher: Fetcher, base: str) -> bytes:
    url = f"{base}{METADATA_DIR}/1.root.json"
    received = bytearray()
    try:
        for block in fetcher.chunks(url):
            received += block
            if len(received) > ROOT_MAX_BYTES:
                raise InputError(f"{url}: larger than {ROOT_MAX_BYTES} bytes; not a root")
    except LocalpersError:
        raise
    except Exception as exc:
        status = getattr(exc, "status_code", None)
        detail = f"HTTP {status}" if status else _reason(exc)
        raise LocalpersError(
            f"{url}: {detail}; {base} is not a signed bundle repository (bundles are pulled from"
            " repositories made with `localpers repo`)"
        ) from None
    return bytes(received)


def choose_trusted_root(
    fetcher: Fetcher, base: str, trust: str | None, confirm: Callable[[str], bool] | None = None
) -> tuple[str, Path]:
    """(fingerprint, trust store) for the repository at `base`; refuses an untrusted publisher.

    The repository's own 1.root.json only says which publisher it claims to be; what is trusted is
    the root already on this device, the shipped demo root, or the root whose fingerprint the user
    gave with `trust` or confirmed once through `confirm(fingerprint)` (checked to be signed by that
    very key).
    """
    from tuf.api.metadata import Metadata, Root

    claimed = _fetch_first_root(fetcher, base)
    fingerprint = root_fingerprint(claimed, f"{base}{METADATA_DIR}/1.root.json")
    store = trust_store(fingerprint)
    if (store / "root.json").exists():
        return fingerprint, store
    demo = demo_root_bytes()
    if fingerprint == root_fingerprint(demo, DEMO_ROOT_RESOURCE):
        _start_store(store, demo)
        return fingerprint, store
    if trust is None and confirm is not None and confirm(fingerprint):
        trust = fingerprint
    if trust is None:
        raise LocalpersError(
            f"{base} is signed by publisher key {fingerprint}, which this device does not trust yet; if that"
            f" is your publisher's fingerprint, pull again with --trust {fingerprint}"
        )
    if trust.strip().lower() != fingerprint:
        raise LocalpersError(
            f"{base} is signed by publisher key {fingerprint}, not {one_line(trust, 80)}; refusing it"
        )
    root = Metadata[Root].from_bytes(claimed)
    try:
        root.signed.verify_delegate("root", root.signed_bytes, root.signatures)
    except Exception as exc:
        raise InputError(
            f"{base}{METADATA_DIR}/1.root.json: not signed by its root key ({_reason(exc)})"
        ) from None
    _start_store(store, claimed)
    return fingerprint, store


def _start_store(store: Path, root_bytes: bytes) -> None:
    staging = Path(tempfile.mkdtemp(prefix=".trust-", dir=store.parent if store.parent.exists() else None))
    try:
        (staging / "root.json").write_bytes(root_bytes)
        store.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), str(store))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


# --------------------------------------------------------------------------------------------------
# The signed source `localpers.bundle.pull` installs from


class SignedSource:
    """A bundle whose every file is a TUF target of a repository this device trusts."""

    def __init__(
        self,
        source: str,
        *,
        timeout: float,
        trust: str | None = None,
        on_bytes: Callable[[int], None] | None = None,
        confirm: Callable[[str], bool] | None = None,
    ) -> None:
        from tuf.ngclient import Updater

        self.base = _repository_base(source)
        self.description = self.base
        self.fetcher = Fetcher(timeout, on_bytes)
        self.fingerprint, store = choose_trusted_root(self.fetcher, self.base, trust, confirm)
        self._updater = Updater(
            metadata_dir=str(store),
            metadata_base_url=f"{self.base}{METADATA_DIR}/",
            target_base_url=f"{self.base}{TARGETS_DIR}/",
            fetcher=self.fetcher.as_tuf_fetcher(),
            bootstrap=None,
        )
        with self._tuf_errors(f"{self.base}{METADATA_DIR}/"):
            self._updater.refresh()

    @contextlib.contextmanager
    def _tuf_errors(self, where: str) -> Iterator[None]:
        from tuf.api import exceptions

        try:
            yield
        except LocalpersError:
            raise
        except exceptions.ExpiredMetadataError as exc:
            raise InputError(
                f"{where}: signed metadata has expired ({one_line(str(exc), 200)}); the repository is stale or"
                " frozen by an attacker: ask the publisher to run `localpers repo refresh`"
            ) from None
        except exceptions.BadVersionNumberError as exc:
            raise InputError(
                f"{where}: metadata is older than what this device already trusts ({one_line(str(exc), 200)});"
                " refusing a rollback"
            ) from None
        except exceptions.LengthOrHashMismatchError as exc:
            raise InputError(
                f"{where}: a file does not match its signed length or hash ({one_line(str(exc), 200)});"
                " it was tampered with or damaged"
            ) from None
        except exceptions.DownloadLengthMismatchError as exc:
            raise InputError(
                f"{where}: the server sends more than the signed length ({one_line(str(exc), 200)})"
            ) from None
        except exceptions.RepositoryError as exc:
            raise InputError(f"{where}: signed metadata refused ({_reason(exc)})") from None
        except exceptions.DownloadError as exc:
            cause = exc.__cause__ or exc
            if isinstance(cause, LocalpersError):  # raised by our fetcher, wrapped by python-tuf
                raise cause from None
            raise LocalpersError(f"{where}: download failed ({_reason(cause)}); try again") from None
        except (OSError, http.client.HTTPException) as exc:
            raise LocalpersError(f"{where}: {_reason(exc)}") from None

    def _target(self, relative: str) -> Any:
        path = BUNDLE_PREFIX + relative
        with self._tuf_errors(f"{self.base}{TARGETS_DIR}/{path}"):
            info = self._updater.get_targetinfo(path)
        if info is None:
            raise InputError(
                f"{self.base}: {path} is not a signed target of this repository; the bundle is incomplete"
                " or was not published with `localpers repo add`"
            )
        return info

    def where(self, relative: str) -> str:
        return f"{self.base}{TARGETS_DIR}/{BUNDLE_PREFIX}{relative}"

    def read_manifest(self) -> bytes:
        from localpers.bundle.format import MANIFEST_NAME

        info = self._target(MANIFEST_NAME)
        with tempfile.TemporaryDirectory() as scratch:
            target = Path(scratch) / MANIFEST_NAME
            with self._tuf_errors(self.where(MANIFEST_NAME)):
                self._updater.download_target(info, str(target))
            return target.read_bytes()

    def check_listed(self, relative: str, entry: dict[str, Any]) -> None:
        """Refuse a manifest entry whose size or sha256 differs from the signed target's."""
        info = self._target(relative)
        if info.length != entry["size"] or info.hashes.get("sha256") != entry["sha256"]:
            raise InputError(
                f"{self.where(relative)}: manifest.json lists size {entry['size']} sha256 {entry['sha256']},"
                f" the signed target has {info.length} and {info.hashes.get('sha256')}; refusing the bundle"
            )

    def download_backbone(self, sha256: str, destination: Path) -> int:
        """Download the signed target `backbone/<sha256>.gguf` to `destination`, resuming a `.partial`
        left by an interrupted pull; checked against its signed length and hash. Returns its length."""
        path = f"{BACKBONE_PREFIX}{sha256}.gguf"
        with self._tuf_errors(f"{self.base}{TARGETS_DIR}/{path}"):
            info = self._updater.get_targetinfo(path)
        if info is None:
            raise InputError(
                f"{self.base}: {path} is not a signed target of this repository; the publisher has not"
                " published this backbone (`localpers repo add-backbone`)"
            )
        if info.hashes.get("sha256") != sha256:
            raise InputError(f"{self.base}: {path} is signed with another sha256; refusing it")
        destination.parent.mkdir(parents=True, exist_ok=True)
        partial = destination.with_name(destination.name + ".partial")
        url = f"{self.base}{TARGETS_DIR}/{BACKBONE_PREFIX}{sha256}.{sha256}.gguf"
        self.fetcher.resume_into(url, partial, info.length)
        try:
            with partial.open("rb") as handle, self._tuf_errors(url):
                info.verify_length_and_hashes(handle)
        except LocalpersError:
            partial.unlink(missing_ok=True)  # the next pull starts this file over
            raise
        partial.replace(destination)
        return int(info.length)

    def download(self, relative: str, entry: dict[str, Any], destination: Path) -> None:
        """Download one listed file to `destination`, checked against the manifest and its signed target."""
        self.check_listed(relative, entry)
        info = self._target(relative)
        destination.parent.mkdir(parents=True, exist_ok=True)
        with self._tuf_errors(self.where(relative)):
            self._updater.download_target(info, str(destination))
