"""The device's side of signed bundle updates: a TUF `Updater` source, from the root `localpers.bundle.trust` chose.

`pull` never trusts what a server says about who signed a repository: it starts from a root this device already
trusts (the shipped demo publisher's, one stored by an earlier pull, or a new publisher's first root accepted for
the fingerprint the user gave; `localpers.bundle.trust`). From there `tuf.ngclient.Updater` walks root rotations, refuses expired (freeze), older (rollback) or
mismatched (mix-and-match) metadata, and downloads no target past its signed length (endless data).
`SignedSource` hands the verified bundle files to `localpers.bundle.pull`, which installs them; the bytes
come through `localpers.bundle.fetcher`. This module
never loads a bundle; the only connections it makes are the fetches of one explicit pull.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import re
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from localpers.bundle.fetcher import Fetcher, reason, repository_base
from localpers.bundle.repository_files import TARGETS_DIR
from localpers.bundle.repository_metadata import BACKBONE_PREFIX, BUNDLE_PREFIX, METADATA_DIR
from localpers.bundle.trust import (
    choose_trusted_root,
    claimed_root,
    is_trusted,
    trust_store,
    trust_store_lock,
)
from localpers.errors import InputError, LocalpersError
from localpers.untrusted import one_line

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
        claimed = claimed_root(self.fetcher, self.base)
        if trust is None and confirm is not None and not is_trusted(claimed[1]) and confirm(claimed[1]):
            trust = claimed[1]  # asked before the lock: another pull waits for no one's answer
        with trust_store_lock():  # the trusted metadata is read and rewritten by one pull at a time
            # chosen: the user named (--trust) or confirmed this publisher for this pull, which may switch publishers
            self.fingerprint, store, self.chosen = choose_trusted_root(
                self.fetcher, self.base, trust, claimed=claimed
            )
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
        from localpers.bundle.format import MANIFEST_NAME, MAX_MANIFEST_BYTES, BundleProblem

        info = self._target(MANIFEST_NAME)
        # refused from its signed length: python-tuf would fetch it all first
        if info.length > MAX_MANIFEST_BYTES:
            raise BundleProblem(
                f"{self.where(MANIFEST_NAME)}: signed as {info.length} bytes, too large for a manifest"
                f" (at most {MAX_MANIFEST_BYTES}); this is not a bundle"
            )
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
