"""Whom a device trusts: publisher roots, kept under `config_dir()/trust/<fingerprint>/`.

`pull` never trusts what a server says about who signed a repository. It starts from a root this device already
trusts:

- the demo publisher's root, shipped in the package (`localpers/trust/demo-publisher-root.json`), which also
  replaces a stored demo root found damaged (another publisher's damaged root is refused, naming the mend);
- a root stored by an earlier pull under `config_dir()/trust/<fingerprint>/` (python-tuf's metadata cache: the
  newest trusted root, timestamp, snapshot and targets, so rollbacks are refused);
- a new publisher's version-1 root, accepted only when its one root key is the key whose fingerprint the user gave
  (`localpers pull URL --trust FINGERPRINT`), computed from the key itself, and signed it; then stored whole.

A pull chooses its root and lets python-tuf update the store under the trust store's lock (`trust_store_lock`),
and a store a stopped pull left without its `root.json` link (python-tuf removes and remakes it on every pull) is
mended from python-tuf's root history, never started over: the newest metadata it keeps is what refuses rollbacks.
This module reads the repository's first root only; following the repository from there is
`localpers.bundle.signed`'s.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.resources
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from localpers.atomic import atomic_write_bytes, fsync_directory
from localpers.bundle.fetcher import Fetcher, reason
from localpers.bundle.keys import key_fingerprint
from localpers.bundle.repository_metadata import METADATA_DIR
from localpers.errors import InputError, LocalpersError
from localpers.folder_lock import locked
from localpers.paths import config_dir
from localpers.regular_files import read_regular_file
from localpers.untrusted import one_line

ROOT_MAX_BYTES = 512_000  # python-tuf's own cap on a root file
DEMO_ROOT_RESOURCE = "demo-publisher-root.json"
TRUST_DIR = "trust"
ROOT_HISTORY = "root_history"  # python-tuf's folder of every trusted root version, which root.json links to


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
    if not _FINGERPRINT.fullmatch(keyids[0]):
        # the fingerprint names a folder of the trust store: "../../Downloads/x/metadata" made any root.json on
        # this device a trusted publisher's, without --trust
        raise InputError(
            f"{origin}: its root key id {one_line(repr(keyids[0]), 80)} is not a fingerprint (64 hex digits);"
            " not a localpers repository"
        )
    return keyids[0]


_FINGERPRINT = re.compile(r"[0-9a-f]{64}")


def checked_fingerprint(trust: str) -> str:
    """`--trust`'s argument as a lowercase fingerprint; InputError unless it is 64 hex digits."""
    fingerprint = trust.strip().lower()
    if not _FINGERPRINT.fullmatch(fingerprint):
        raise InputError(
            f"--trust {one_line(trust, 80)!r} is not a fingerprint: give the 64 hex digits your publisher's"
            " `localpers repo fingerprint` printed"
        )
    return fingerprint


def trust_store(fingerprint: str) -> Path:
    """Where the trusted metadata of the publisher with this root fingerprint lives on this device."""
    if not _FINGERPRINT.fullmatch(fingerprint):
        raise ValueError(f"not a fingerprint: {fingerprint!r}")  # never a path outside the trust store
    return config_dir() / TRUST_DIR / fingerprint


def trusted_fingerprints() -> list[str]:
    root = config_dir(create=False) / TRUST_DIR
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if _FINGERPRINT.fullmatch(p.name) and _holds_a_root(p))


def _holds_a_root(store: Path) -> bool:
    """Whether `store` keeps a trusted root: root.json, or the root history python-tuf links it to (a pull stopped
    between python-tuf's removing the link and making it again leaves only the history)."""
    return (store / "root.json").exists() or _newest_kept_root(store) is not None


def _newest_kept_root(store: Path) -> Path | None:
    """The newest `root_history/N.root.json` python-tuf kept in `store`, or None."""
    history = store / ROOT_HISTORY
    if not history.is_dir():
        return None
    versions = [
        int(name.split(".")[0])
        for name in os.listdir(history)
        if name.endswith(".root.json") and name.split(".")[0].isdigit()
    ]
    return history / f"{max(versions)}.root.json" if versions else None


def _mend_root_link(store: Path) -> None:
    """Put back the root.json link a stopped pull left out (python-tuf removes it, then links it to the newest kept
    root): without it the store read as untrusted, and was started over, newest metadata and all (rollbacks then
    went through: a pull with --trust, or for the demo publisher none, installed an older repository state)."""
    link = store / "root.json"
    newest = _newest_kept_root(store)
    if link.exists() or newest is None:
        return
    with contextlib.suppress(FileNotFoundError):
        link.unlink()  # a link to a root that is gone
    os.symlink(os.path.join(ROOT_HISTORY, newest.name), link)


@contextlib.contextmanager
def trust_store_lock() -> Iterator[None]:
    """Hold the trust store's lock: one pull at a time chooses a root and updates what python-tuf keeps (a second
    pull in the moment python-tuf relinks root.json read the publisher as untrusted, and two first pulls of one
    publisher removed each other's new store)."""
    folder = config_dir() / TRUST_DIR
    folder.mkdir(parents=True, exist_ok=True)

    def told() -> None:
        print(
            f"waiting for another `localpers pull` to finish with {folder} ...", file=sys.stderr, flush=True
        )

    with locked(folder, wait=True, busy="", on_wait=told):
        yield


def is_trusted(fingerprint: str) -> bool:
    """Whether this device trusts the publisher with this root fingerprint without asking (the demo publisher's,
    or one an earlier pull stored)."""
    demo = root_fingerprint(demo_root_bytes(), DEMO_ROOT_RESOURCE)
    return fingerprint == demo or _holds_a_root(trust_store(fingerprint))


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


def claimed_root(fetcher: Fetcher, base: str) -> tuple[bytes, str]:
    """The repository's own 1.root.json and the publisher fingerprint it claims (not yet trusted)."""
    claimed = _fetch_first_root(fetcher, base)
    return claimed, root_fingerprint(claimed, f"{base}{METADATA_DIR}/1.root.json")


def choose_trusted_root(
    fetcher: Fetcher,
    base: str,
    trust: str | None,
    confirm: Callable[[str], bool] | None = None,
    *,
    claimed: tuple[bytes, str] | None = None,
) -> tuple[str, Path, bool]:
    """(fingerprint, trust store, whether the user named or confirmed this publisher for this pull) for the
    repository at `base`; refuses an untrusted publisher.

    The repository's own 1.root.json only says which publisher it claims to be; what is trusted is
    the root already on this device, the shipped demo root, or the root whose fingerprint the user
    gave with `trust` or confirmed once through `confirm(fingerprint)` (a root held by that one key alone and
    signed by it, `_check_first_root`). A `trust` that names another publisher than the repository's is refused,
    even one this device trusts already.
    """
    claimed_bytes, fingerprint = claimed if claimed is not None else claimed_root(fetcher, base)
    if trust is not None and trust.strip().lower() != fingerprint:
        raise LocalpersError(
            f"{base} is signed by publisher key {fingerprint}, not {one_line(trust, 80)}; refusing it (a repository"
            " keeps the fingerprint of its first root after a key rotation: ask your publisher for the one"
            " `localpers repo fingerprint` prints)"
        )
    store = trust_store(fingerprint)
    demo = demo_root_bytes()
    is_demo = fingerprint == root_fingerprint(demo, DEMO_ROOT_RESOURCE)
    _mend_root_link(store)
    if (store / "root.json").exists():
        if is_demo and not _is_root_metadata(store / "root.json"):
            # the package ships this publisher's first root: trust starts from it again, and the update goes
            # through every root since, each signed by the one before (no --trust to ask the user for)
            if not (store / "root.json").is_dir():  # a FIFO or device is not written through: replaced
                (store / "root.json").unlink()
            atomic_write_bytes(store / "root.json", demo)
        _check_kept_root(store, fingerprint)
        return fingerprint, store, trust is not None
    if is_demo:
        _start_store(store, demo)
        return fingerprint, store, trust is not None
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
    _check_first_root(claimed_bytes, fingerprint, f"{base}{METADATA_DIR}/1.root.json")
    _start_store(store, claimed_bytes)
    return fingerprint, store, True


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
    key = root.signed.keys.get(fingerprint)
    if key is None:  # python-tuf accepts a root role naming a key the file does not hold
        raise InputError(f"{where}: its root key {fingerprint} is not in the file; refusing it")
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


def _root_problem(path: Path) -> str | None:
    """Why the file at `path` is not root metadata, or None when it is."""
    from tuf.api.metadata import Metadata, Root

    try:  # a FIFO there hung every pull, a link to /dev/zero read until memory ran out
        data = read_regular_file(path, ROOT_MAX_BYTES, what="trusted root", stored=True)
    except (LocalpersError, OSError) as exc:
        return one_line(str(exc), 200)
    try:
        Metadata[Root].from_bytes(data)
    except Exception as exc:  # python-tuf raises several types for malformed metadata
        return reason(exc)
    return None


def _is_root_metadata(path: Path) -> bool:
    return _root_problem(path) is None


def _check_kept_root(store: Path, fingerprint: str) -> None:
    """Refuse, naming it and the mend, a trusted root on this device that is not root metadata (a write cut
    short by a full disk in an older localpers): python-tuf's refusal read as the repository's fault. The other
    files python-tuf reads from the store must be regular files: it opens them blocking, and a FIFO there hung
    this pull and, through the trust store's lock, every other."""
    path = store / "root.json"
    problem = _root_problem(path)
    if problem is not None:
        raise InputError(
            f"{path}: this device's trusted root for publisher {fingerprint} is damaged ({problem}); delete"
            f" {store} and pull again with --trust and the fingerprint your publisher gave you"
        )
    history = store / "root_history"
    kept = sorted(history.glob("*.root.json")) if history.is_dir() else []
    for path in [store / "timestamp.json", store / "snapshot.json", store / "targets.json", *kept]:
        try:
            kind = os.stat(path).st_mode
        except FileNotFoundError:
            continue  # python-tuf fetches it again
        except OSError as exc:
            raise InputError(
                f"{path}: cannot be read ({exc.strerror}); this device's trust store for publisher {fingerprint}"
                " needs it readable"
            ) from None
        if not stat.S_ISREG(kind):
            raise InputError(
                f"{path} is not a regular file (a FIFO, device, socket or folder) in this device's trust store"
                f" for publisher {fingerprint}; delete it and pull again"
            )


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
        fsync_directory(store.parent)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, OSError):
            mend = "free some space there" if exc.errno == errno.ENOSPC else "check that folder"
            raise LocalpersError(
                f"cannot keep the publisher's root in {store} ({reason(exc)}); nothing was installed: {mend} and"
                " pull again"
            ) from None
        raise
