"""Whom a first pull trusts (eighty-second session's audit of the bundle path): `--trust FP` is kept only by a
root held by that one key and signed by it, a `--trust` naming another publisher is refused even when the
repository's own publisher is trusted already, and the trusted root is written whole or not at all."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from test_serve_pull import make_bundle, publish
from test_signed_pull import nothing_installed, pull

from localpers.bundle import trust
from localpers.bundle.keys import generate_keys, load_signer
from localpers.bundle.locations import installed_bundle_dir
from localpers.bundle.repository import add_bundle, init_repository, root_keyid
from localpers.bundle.trust import trust_store
from localpers.errors import InputError, LocalpersError


@pytest.fixture
def genuine(tmp_path: Path) -> tuple[Path, str]:
    """(repository, fingerprint) of the publisher the device owner means."""
    repo_dir = tmp_path / "genuine"
    return repo_dir, publish(make_bundle(tmp_path / "genuine-bundle"), repo_dir, tmp_path / "genuine-keys")


@pytest.fixture
def genuine_low(tmp_path: Path) -> tuple[Path, str]:
    """(repository, fingerprint) of a genuine publisher whose root key id starts with 0-7, so that an attacker's
    key sorts after it one try in two or more (a fingerprint such as fe99... left 64 tries short one run in three)."""
    for attempt in range(256):
        keys = tmp_path / f"genuine-keys-{attempt}"
        generate_keys(keys)
        if load_signer(keys, "root").public_key.keyid < "8":
            break
    else:
        raise AssertionError("no root key id below 8 in 256 tries")
    repo_dir = tmp_path / "genuine"
    fingerprint = init_repository(repo_dir, keys)
    add_bundle(repo_dir, make_bundle(tmp_path / "genuine-bundle"), keys)
    return repo_dir, fingerprint


def attackers_repository(tmp_path: Path, fingerprint: str) -> Path:
    """A repository whose first root lists the genuine root key beside the attacker's (threshold 1), signed by the
    attacker's key alone: its first key id, the fingerprint, is the genuine publisher's."""
    from tuf.api.metadata import Metadata, Root

    for attempt in range(64):  # root key ids sorting after the genuine one (genuine_low: one try in two)
        keys = tmp_path / f"evil-keys-{attempt}"
        generate_keys(keys)
        if load_signer(keys, "root").public_key.keyid > fingerprint:
            break
    else:
        raise AssertionError(f"no attacker's root key id above {fingerprint} in 64 tries")
    evil = tmp_path / "evil"
    init_repository(evil, keys)
    add_bundle(evil, make_bundle(tmp_path / "evil-bundle", seed="evil"), keys)
    genuine_root = Metadata[Root].from_file(str(tmp_path / "genuine" / "metadata" / "1.root.json")).signed
    claimed = Metadata[Root].from_file(str(evil / "metadata" / "1.root.json"))
    claimed.signed.add_key(genuine_root.keys[fingerprint], "root")
    claimed.signatures.clear()
    claimed.sign(load_signer(keys, "root"))
    for name in ("1.root.json", "root.json"):
        (evil / "metadata" / name).write_bytes(claimed.to_bytes())
    assert root_keyid(evil) == fingerprint  # it carries the genuine fingerprint
    return evil


def test_a_first_root_carrying_the_trusted_key_beside_another_is_refused(
    tmp_path: Path, genuine_low: tuple[Path, str]
) -> None:
    """A hostile mirror's root listed the publisher's public root key and its own, threshold 1, signed by its own:
    `pull --trust FP` installed the attacker's bundle and kept the attacker's root as the publisher's."""
    genuine_repository, fingerprint = genuine_low
    evil = attackers_repository(tmp_path, fingerprint)
    with pytest.raises(InputError, match="its root role lists 2 keys"):
        pull(evil, trust=fingerprint)
    assert nothing_installed() and not trust_store(fingerprint).exists()
    pull(genuine_repository, trust=fingerprint)  # the genuine repository is still trusted on first contact


def test_trust_naming_another_publisher_is_refused_even_when_the_repository_is_trusted(
    tmp_path: Path, genuine: tuple[Path, str]
) -> None:
    """A device that trusted publisher B installed B's bundle from a source pulled with --trust of publisher X."""
    other = tmp_path / "other"
    other_fingerprint = publish(
        make_bundle(tmp_path / "other-bundle", seed="other"), other, tmp_path / "other-keys"
    )
    pull(other, trust=other_fingerprint)
    installed = installed_bundle_dir()
    with pytest.raises(
        LocalpersError, match=f"signed by publisher key {other_fingerprint}, not {genuine[1]}"
    ):
        pull(other, trust=genuine[1])
    assert installed_bundle_dir() == installed and not trust_store(genuine[1]).exists()


def test_a_trusted_root_is_written_whole_or_not_at_all(
    genuine: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk during the first pull left an empty root.json (every later pull refused, as if the repository were
    at fault), and a folder left without one had the next try's folder moved inside it."""
    repo_dir, fingerprint = genuine
    store = trust_store(fingerprint)

    def full_disk(descriptor: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patched:  # not monkeypatch.undo(): that would undo the isolated home too
        patched.setattr(trust.os, "fsync", full_disk)
        with pytest.raises(LocalpersError, match="cannot keep the publisher's root in .*No space left"):
            pull(repo_dir, trust=fingerprint)
    assert not store.exists() and not list(store.parent.glob(".trust-*"))
    store.mkdir(parents=True)  # what an older localpers's failed write left: a folder, no root.json
    (store / "leftover").write_text("")
    pull(repo_dir, trust=fingerprint)
    assert (store / "root.json").is_file() and not list(store.glob(".trust-*"))
    pull(repo_dir)  # trusted from now on


def test_a_first_root_filing_another_key_under_the_trusted_id_is_refused(
    tmp_path: Path, genuine: tuple[Path, str]
) -> None:
    """A key id is only a label in the metadata: the attacker's own root key filed under the publisher's id, and a
    root signed by it, passed the one-key check and got the attacker's bundle installed (session review)."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from securesystemslib.signer import CryptoSigner, SSlibKey
    from tuf.api.metadata import Metadata, Root

    _, fingerprint = genuine
    keys, evil = tmp_path / "evil-keys", tmp_path / "evil"
    generate_keys(keys)
    init_repository(evil, keys)
    add_bundle(evil, make_bundle(tmp_path / "evil-bundle", seed="evil"), keys)
    own = load_signer(keys, "root").public_key
    forged = SSlibKey(
        fingerprint, own.keytype, own.scheme, own.keyval
    )  # the attacker's key, the publisher's id
    signer = CryptoSigner(load_pem_private_key((keys / "root.key").read_bytes(), password=None), forged)
    claimed = Metadata[Root].from_file(str(evil / "metadata" / "1.root.json"))
    claimed.signed.revoke_key(own.keyid, "root")
    claimed.signed.add_key(forged, "root")
    claimed.signatures.clear()
    claimed.sign(signer)
    for name in ("1.root.json", "root.json"):
        (evil / "metadata" / name).write_bytes(claimed.to_bytes())
    assert root_keyid(evil) == fingerprint
    with pytest.raises(InputError, match=f"the root key filed under {fingerprint} is another key"):
        pull(evil, trust=fingerprint)
    assert nothing_installed() and not trust_store(fingerprint).exists()
