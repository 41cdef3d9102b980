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
`SignedSource` hands the verified bundle files to `localpers.bundle.pull`, which installs them; the bytes
come through `localpers.bundle.fetcher`. This module
never loads a bundle; the only connections it makes are the fetches of one explicit pull.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import importlib.resources
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from localpers.bundle.fetcher import Fetcher, reason, repository_base
from localpers.bundle.keys import key_fingerprint
from localpers.bundle.repository import BACKBONE_PREFIX, BUNDLE_PREFIX, METADATA_DIR, TARGETS_DIR
from localpers.errors import InputError, LocalpersError
from localpers.paths import config_dir
from localpers.untrusted import one_line

ROOT_MAX_BYTES = 512_000  # python-tuf's own cap on a root file
DEMO_ROOT_RESOURCE = "demo-publisher-root.json"
TRUST_DIR = "trust"


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
        raise InputError(f"{origin}: not valid TUF root metadata ({reason(exc)})") from None
    return keyids[0]


def checked_fingerprint(trust: str) -> str:
    """`--trust`'s argument as a lowercase fingerprint; InputError unless it is 64 hex digits."""
    fingerprint = trust.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{64}", fingerprint):
        raise InputError(
            f"--trust {one_line(trust, 80)!r} is not a fingerprint: give the 64 hex digits your publisher's"
            " `localpers repo fingerprint` printed"
        )
    return fingerprint


def trust_store(fingerprint: str) -> Path:
    """Where the trusted metadata of the publisher with this root fingerprint lives on this device."""
    return config_dir() / TRUST_DIR / fingerprint


def trusted_fingerprints() -> list[str]:
    root = config_dir() / TRUST_DIR
    return sorted(p.name for p in root.iterdir() if (p / "root.json").exists()) if root.is_dir() else []


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
        detail = f"HTTP {status}" if status else reason(exc)
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
    gave with `trust` or confirmed once through `confirm(fingerprint)` (a root held by that one key alone and
    signed by it, `_check_first_root`). A `trust` that names another publisher than the repository's is refused,
    even one this device trusts already.
    """
    claimed = _fetch_first_root(fetcher, base)
    fingerprint = root_fingerprint(claimed, f"{base}{METADATA_DIR}/1.root.json")
    if trust is not None and trust.strip().lower() != fingerprint:
        raise LocalpersError(
            f"{base} is signed by publisher key {fingerprint}, not {one_line(trust, 80)}; refusing it (a repository"
            " keeps the fingerprint of its first root after a key rotation: ask your publisher for the one"
            " `localpers repo fingerprint` prints)"
        )
    store = trust_store(fingerprint)
    if (store / "root.json").exists():
        _check_kept_root(store, fingerprint)
        return fingerprint, store
    demo = demo_root_bytes()
    if fingerprint == root_fingerprint(demo, DEMO_ROOT_RESOURCE):
        _start_store(store, demo)
        return fingerprint, store
    if trust is None and confirm is not None and confirm(fingerprint):
        trust = fingerprint
    if trust is None:
        # Never a ready-made --trust command: whoever runs the server chose this key.
        raise LocalpersError(
            f"{base} is signed by publisher key {fingerprint}, which this device does not trust yet; the repository"
            " itself names that key, so compare it with the fingerprint your publisher gave you another way (not"
            " from this repository) and only if they match, pull again with --trust and the fingerprint from your"
            " publisher"
        )
    _check_first_root(claimed, fingerprint, f"{base}{METADATA_DIR}/1.root.json")
    _start_store(store, claimed)
    return fingerprint, store


def _check_first_root(claimed: bytes, fingerprint: str, where: str) -> None:
    """Refuse a first root not held by the trusted key alone, or not signed by it.

    The fingerprint is the root role's first key id: a root listing the publisher's public key beside another
    key, with a threshold the other key meets, carries the publisher's fingerprint without the publisher's
    signature, and whoever holds the other key would sign every later root. A publisher's root (`localpers repo`)
    has one root key, so the trusted key must be the only one, and its signature must verify.
    """
    from tuf.api.metadata import Metadata, Root

    root = Metadata[Root].from_bytes(claimed)
    keyids = set(root.signed.roles["root"].keyids)
    if keyids != {fingerprint}:
        raise InputError(
            f"{where}: its root role lists {len(keyids)} keys; a publisher's root is held by the one key you"
            " trust, so this is not your publisher's repository; refusing it"
        )
    key = root.signed.keys[fingerprint]
    if key_fingerprint(key.keytype, key.scheme, key.keyval) != fingerprint:
        # a key id is only a label in the metadata: another key filed under the publisher's id signs as "it"
        raise InputError(
            f"{where}: the root key filed under {fingerprint} is another key (its own fingerprint is"
            f" {key_fingerprint(key.keytype, key.scheme, key.keyval)}); refusing it"
        )
    try:
        root.signed.verify_delegate("root", root.signed_bytes, root.signatures)
    except Exception as exc:
        raise InputError(f"{where}: not signed by its root key ({reason(exc)})") from None


def _check_kept_root(store: Path, fingerprint: str) -> None:
    """Refuse, naming it and the mend, a trusted root on this device that is not root metadata (a write cut
    short by a full disk in an older localpers): python-tuf's refusal read as the repository's fault."""
    from tuf.api.metadata import Metadata, Root

    path = store / "root.json"
    try:
        Metadata[Root].from_bytes(path.read_bytes())
    except Exception as exc:  # python-tuf raises several types for malformed metadata
        raise InputError(
            f"{path}: this device's trusted root for publisher {fingerprint} is damaged ({reason(exc)}); delete"
            f" {store} and pull again with --trust and the fingerprint your publisher gave you"
        ) from None


def _start_store(store: Path, root_bytes: bytes) -> None:
    """Make `store` holding `root_bytes` as root.json, or nothing: written beside it, fsynced, renamed into place
    (a full disk or a stop leaves no empty root.json that every later pull would be refused by)."""
    store.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".trust-", dir=store.parent))
    try:
        with (staging / "root.json").open("wb") as handle:
            handle.write(root_bytes)
            handle.flush()
            os.fsync(handle.fileno())
        if (
            store / "root.json"
        ).exists():  # another first pull of this publisher got here first: keep its store
            shutil.rmtree(staging, ignore_errors=True)
            return
        if store.exists():  # a folder without root.json: what an older localpers left when its write failed
            shutil.rmtree(store)
        os.rename(staging, store)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, OSError):
            mend = "free some space there" if exc.errno == errno.ENOSPC else "check that folder"
            raise LocalpersError(
                f"cannot keep the publisher's root in {store} ({reason(exc)}); nothing was installed: {mend} and"
                " pull again"
            ) from None
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

        self.base = repository_base(source)
        self.description = self.base
        self.manifest_sha256 = ""  # the signed target hash of bundle/manifest.json, once read
        self.fetcher = Fetcher(timeout, on_bytes)
        self.fingerprint, store = choose_trusted_root(self.fetcher, self.base, trust, confirm)
        with self._tuf_errors(str(store / "root.json")):  # the root this device trusts, damaged on disk
            self._updater = Updater(
                metadata_dir=str(store),
                metadata_base_url=f"{self.base}{METADATA_DIR}/",
                target_base_url=f"{self.base}{TARGETS_DIR}/",
                fetcher=self.fetcher.as_tuf_fetcher(),
                bootstrap=None,
            )
        with self._tuf_errors(f"{self.base}{METADATA_DIR}/"):
            self._updater.refresh()

    def _failed_file(self, where: str) -> str:
        """`where`, or for the metadata folder the metadata file python-tuf fetched last (the one it refused:
        it checks each file as it arrives). A trusted copy on this device is not named this way."""
        last = self.fetcher.last_url
        return last if where.endswith(f"/{METADATA_DIR}/") and last.startswith(where) else where

    def _expired(self, where: str, tuf_message: str) -> str:
        """Which signed metadata expired, by this device's clock (which may be the thing that is wrong), and what
        mends it."""
        found = re.search(r"\b(root|timestamp|snapshot|targets)\b", tuf_message)
        role = found.group(1) if found else "metadata"
        where = f"{self.base}{METADATA_DIR}/root.json" if role == "root" else self._failed_file(where)
        now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        # a root left to expire has usually outlived the others too
        mend = {"root": " --root --all", "timestamp": "", "metadata": ""}.get(role, " --all")
        return (
            f"{where}: the repository's signed {role} metadata has expired by this device's clock ({now}); if"
            " that clock is wrong, set it right and pull again; if not, the repository is stale or frozen by an"
            f" attacker: ask the publisher to run `localpers repo refresh{mend}`"
        )

    @contextlib.contextmanager
    def _tuf_errors(self, where: str) -> Iterator[None]:
        from tuf.api import exceptions

        try:
            yield
        except LocalpersError:
            raise
        except exceptions.ExpiredMetadataError as exc:
            raise InputError(self._expired(where, str(exc))) from None
        except exceptions.BadVersionNumberError as exc:
            raise InputError(
                f"{self._failed_file(where)}: metadata is older than what this device already trusts"
                f" ({one_line(str(exc), 200)}); refusing a rollback"
            ) from None
        except exceptions.LengthOrHashMismatchError as exc:
            raise InputError(
                f"{self._failed_file(where)}: a file does not match its signed length or hash"
                f" ({one_line(str(exc), 200)}); it was tampered with or damaged"
            ) from None
        except exceptions.DownloadLengthMismatchError as exc:
            failed = self._failed_file(where)
            # timestamp.json (and a root) is the one file fetched without a signed length: its cap is this device's
            limit = (
                "this device accepts for it" if failed.endswith(("timestamp.json", "root.json")) else "signed"
            )
            raise InputError(
                f"{failed}: the server sends more than the length {limit} ({one_line(str(exc), 200)})"
            ) from None
        except exceptions.RepositoryError as exc:
            raise InputError(
                f"{self._failed_file(where)}: signed metadata refused ({reason(exc)}); nothing was installed: it"
                " is damaged, or not signed by the keys this device trusts for this publisher; pull again later,"
                " and tell the publisher if it stays so"
            ) from None
        except exceptions.DownloadError as exc:
            cause = exc.__cause__ or exc
            if isinstance(cause, LocalpersError):  # raised by our fetcher, wrapped by python-tuf
                raise cause from None
            if getattr(cause, "status_code", None) == 403:
                raise LocalpersError(
                    f"{self._failed_file(where)}: it cannot be read there ({reason(cause)}); nothing was"
                    " installed: the repository's files need read permission for the web server (or, in a"
                    " folder, for you); ask the publisher if it is not yours"
                ) from None
            if getattr(cause, "status_code", None) == 404:  # trying again finds the same repository
                raise LocalpersError(
                    f"{self._failed_file(where)}: the repository has no such file ({reason(cause)}); nothing was"
                    " installed: it is not a whole repository (an upload cut short, or another folder at this"
                    " address); check the address, or ask the publisher to upload the whole repository again"
                ) from None
            raise LocalpersError(
                f"{self._failed_file(where)}: download failed ({reason(cause)}); try again"
            ) from None
        except OSError as exc:
            if exc.errno == errno.ENOSPC:  # this device's disk, not the repository's file
                raise LocalpersError(
                    f"no space left on this device while downloading {where} (python-tuf stages each file in"
                    f" {tempfile.gettempdir()}, and keeps the metadata it trusts in {trust_store(self.fingerprint)});"
                    " free some space there and pull again"
                ) from None
            raise LocalpersError(f"{where}: {reason(exc)}") from None
        except http.client.HTTPException as exc:
            raise LocalpersError(f"{where}: {reason(exc)}") from None

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
        self.manifest_sha256 = str(info.hashes.get("sha256", ""))  # recorded by pull beside the install
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
