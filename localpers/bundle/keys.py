"""The publisher's signing keys for a signed repository: make them, load them, check them before signing.

Keys are ed25519, one per top-level TUF role (threshold 1), kept as PEM files (`<role>.key`, mode 0600) with
their public halves (`<role>.pub.json`) in a keys directory that is never part of the repository: a keys
directory inside it is refused, since everything there is uploaded. `load_signers` checks each key against the
keyids the repository's root trusts before anything is signed, so a wrong keys directory changes nothing. This
module writes only key files; the repository's metadata is `localpers.bundle.repository`'s.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from localpers.atomic import atomic_write_text, fsync_directory
from localpers.errors import InputError, LocalpersError
from localpers.regular_files import read_regular_file

ROLES = ("root", "targets", "snapshot", "timestamp")
KEY_SUFFIX = ".key"  # PEM private key, mode 0600
PUBLIC_SUFFIX = ".pub.json"  # the public key as TUF key JSON
SHORT_KEYID = 12  # hex digits of a keyid shown in an error
MAX_KEY_FILE_BYTES = 64 * 1024  # an ed25519 PEM is some 120 bytes
SIGNED_REPOSITORIES = "repositories.json"  # the repositories `repo init` made with these keys (paths)
# where a repository's own key is missing: new keys would sign what its root does not trust
REPOSITORY_KEY_ADVICE = (
    "give the keys directory this repository was signed with (a timestamp-only folder re-signs the timestamp"
    " alone); keys made anew with `localpers repo keygen` are not the ones its root trusts, unless the"
    " repository is first rotated to them with `localpers repo rotate`"
)


def fingerprint(keyid: str) -> str:
    """How a key is shown to people: its TUF keyid (sha256 of the canonical public key), in full."""
    return keyid


def key_fingerprint(keytype: str, scheme: str, keyval: dict[str, Any]) -> str:
    """The fingerprint of a public key computed from the key itself: the sha256 of its canonical JSON, which is
    the keyid `repo keygen` gives it. Metadata can file any key under any id; a device checks the key against
    this before trusting it as the one a fingerprint names."""
    from securesystemslib.formats import encode_canonical

    canonical = encode_canonical({"keytype": keytype, "scheme": scheme, "keyval": keyval})
    return hashlib.sha256(str(canonical).encode("utf-8")).hexdigest()


def generate_keys(keys_dir: Path) -> dict[str, str]:
    """One new ed25519 key per role in `keys_dir` (refuses to overwrite); returns role -> keyid."""
    from securesystemslib.signer import CryptoSigner

    keys_dir = Path(keys_dir)
    if keys_dir.exists() and not keys_dir.is_dir():
        raise InputError(
            f"{keys_dir} is a file, not a directory; give a new directory for the keys"
            " (`localpers repo keygen DIR` creates it)"
        )
    # lexists: a link to nothing there passed, and the set was left half written
    names = [f"{role}{suffix}" for role in ROLES for suffix in (KEY_SUFFIX, PUBLIC_SUFFIX)]
    existing = [name for name in names if os.path.lexists(keys_dir / name)]
    if existing:
        raise LocalpersError(
            f"{keys_dir} already holds key files ({', '.join(existing)}); use another directory, keys are never"
            " overwritten"
        )
    try:
        keys_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except (FileExistsError, NotADirectoryError):  # a parent is a file
        raise InputError(
            f"{keys_dir}: a part of this path is a file, not a directory; give a new directory for the keys"
        ) from None
    if os.name == "posix" and keys_dir.stat().st_mode & 0o022:  # another account could swap root.key first
        raise InputError(
            f"{keys_dir} can be written by other accounts (mode {keys_dir.stat().st_mode & 0o777:o}); give a"
            " folder only you can write in (`chmod go-w` it, or a new one)"
        )
    keyids: dict[str, str] = {}
    written: list[Path] = []
    try:
        for role in ROLES:
            signer = CryptoSigner.generate_ed25519()
            public = signer.public_key
            document = json.dumps({"keyid": public.keyid, **public.to_dict()}, indent=2) + "\n"
            for name, data, mode in (
                (f"{role}{KEY_SUFFIX}", signer.private_bytes, 0o600),
                (f"{role}{PUBLIC_SUFFIX}", document.encode(), 0o644),
            ):
                _write_new_file(keys_dir / name, data, mode)
                written.append(keys_dir / name)
            keyids[role] = public.keyid
        fsync_directory(keys_dir)
    except BaseException as exc:
        for path in written:  # never half a key set: the next keygen in this folder would be refused
            path.unlink(missing_ok=True)
        if isinstance(exc, FileExistsError):  # a file that appeared meanwhile: named, not its temporary
            raise LocalpersError(
                f"{keys_dir}: a key file appeared while the keys were written; nothing was kept, use another"
                " directory"
            ) from None
        raise
    return keyids


def _write_new_file(path: Path, data: bytes, mode: int) -> None:
    """Write `path` whole and durably, never over an existing file: a key written in place and lost to a power
    cut left an empty root.key behind a repository devices had already pinned."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), mode)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(partial, path)  # refuses an existing file, as O_EXCL did
        except FileExistsError:
            raise
        except OSError:  # no hard links there (a FAT memory stick, where an offline root key may live)
            if path.exists():
                raise FileExistsError(path) from None
            os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def load_signer(
    keys_dir: Path,
    role: str,
    option: str = "--keys",
    missing: str = "create keys with `localpers repo keygen DIR`",
) -> Any:
    """The signer of `role` from its PEM file in `keys_dir` (given with the command-line `option`); `missing` is
    the advice when the file is not there."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from securesystemslib.signer import CryptoSigner, SSlibKey

    keys_dir = Path(keys_dir)
    if keys_dir.exists() and not keys_dir.is_dir():
        raise InputError(
            f"{option} {keys_dir} is a file, not a keys directory; give the directory"
            " `localpers repo keygen DIR` created"
        )
    path = keys_dir / f"{role}{KEY_SUFFIX}"
    if not path.exists() and not path.is_symlink():
        raise LocalpersError(f"{path}: no {role} key there; {missing}")
    # a link to /dev/zero or a FIFO in place of a key is refused, never read
    pem = read_regular_file(path, MAX_KEY_FILE_BYTES, what="private key file")
    try:
        private_key = load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise InputError(f"{path}: not a PEM private key ({exc})") from None
    try:  # an X25519, Ed448 or DSA key loads as PEM but is no TUF signing key: securesystemslib raises ValueError
        public = SSlibKey.from_crypto(private_key.public_key())
    except ValueError as exc:
        raise InputError(
            f"{path}: a {type(private_key).__name__.lstrip('_')} key, which cannot sign TUF metadata ({exc}); give"
            " the key `localpers repo keygen` made"
        ) from None
    return CryptoSigner(private_key, public)


def check_keys_outside(repo_dir: Path, keys_dir: Path, option: str = "--keys") -> None:
    """Refuse a keys directory that is the repository directory or inside it (compared resolved):
    everything in a repository is uploaded to the web server, and private keys must never be."""
    repo, keys = Path(repo_dir).resolve(), Path(keys_dir).resolve()
    if keys == repo or repo in keys.parents:
        raise InputError(
            f"{option} {keys_dir} is inside the repository {repo_dir}: private keys must never be uploaded"
            " with it; move the keys directory out of the repository and give its new place"
        )


def load_signers(
    repo_dir: Path, root: Any, keys_dir: Path, roles: Iterable[str], option: str = "--keys"
) -> dict[str, Any]:
    """The signers of `roles` from `keys_dir`, each checked against the keyids the repository's `root`
    metadata trusts for its role: called before anything is copied or written, so a wrong, missing or misplaced
    key changes nothing (a signature by an untrusted key would make every device refuse the repository)."""
    check_keys_outside(repo_dir, keys_dir, option)
    signers: dict[str, Any] = {}
    for role in roles:
        signer = load_signer(keys_dir, role, option, missing=REPOSITORY_KEY_ADVICE)
        trusted = sorted(root.signed.roles[role].keyids)
        if signer.public_key.keyid not in trusted:
            shown = ", ".join(keyid[:SHORT_KEYID] for keyid in trusted)
            raise InputError(
                f"{option} {keys_dir}: the {role} key {signer.public_key.keyid[:SHORT_KEYID]} is not one this"
                f" repository's root trusts ({shown}); give this repository's keys directory"
            )
        signers[role] = signer
    return signers


def signed_repositories(keys_dir: Path) -> list[str]:
    """The repositories `repo init` made with the keys in `keys_dir` (resolved paths; none if never recorded)."""
    try:
        listed = json.loads((Path(keys_dir) / SIGNED_REPOSITORIES).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [entry for entry in listed if isinstance(entry, str)] if isinstance(listed, list) else []


def remember_repository(keys_dir: Path, repo_dir: Path) -> None:
    """Record that `repo_dir` was made with the keys in `keys_dir` (a later init with them is warned)."""
    known = signed_repositories(keys_dir)
    made = str(Path(repo_dir).resolve())
    if made not in known:
        atomic_write_text(Path(keys_dir) / SIGNED_REPOSITORIES, json.dumps([*known, made], indent=1) + "\n")
