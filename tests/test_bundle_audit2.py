"""The device's bundle path under a hostile repository or odd input (eighty-sixth session's second bundle audit).

Each test is a case that failed before: a root key id that is a path made any root.json on the device a trusted
publisher's (a bundle installed without --trust); another trusted publisher's genuine repository, served at the
usual source, replaced the bundle in use; a first root whose root key is missing from its keys, and malformed
URLs, ended in tracebacks; a bundle given as `bundles/current` was read through the link the next pull moves; and
`repo keygen` left half a key set beside a link to nothing and took a folder other accounts can write.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from test_serve_pull import BACKBONE_SHA, make_bundle, publish
from test_signed_pull import nothing_installed, pull

from localpers.bundle.format import open_bundle
from localpers.bundle.keys import generate_keys
from localpers.bundle.locations import bundles_root, installed_bundle_dir
from localpers.errors import InputError, LocalpersError
from localpers.paths import config_dir


def publisher(tmp_path: Path, name: str) -> tuple[Path, str]:
    """(repository, fingerprint) of a publisher with one bundle."""
    repository = tmp_path / name
    fingerprint = publish(
        make_bundle(tmp_path / f"{name}-bundle", seed=name), repository, tmp_path / f"{name}-keys"
    )
    return repository, fingerprint


def test_a_root_key_id_that_is_a_path_is_no_publisher(tmp_path: Path) -> None:
    """A copy of a never-trusted publisher's repository on the device (a download): its server filed the root key
    under "../../<the copy>/metadata", and the pull took the copy's root.json for a trusted one."""
    trusted, trusted_fingerprint = publisher(tmp_path, "a")
    pull(trusted, trust=trusted_fingerprint)  # the trust store's folder exists from now on
    stranger, stranger_fingerprint = publisher(tmp_path, "c")
    copy = tmp_path / "Downloads" / "c-repo"
    shutil.copytree(stranger, copy)
    before = sorted(path.name for path in (copy / "metadata").iterdir())
    served = tmp_path / "served"
    shutil.copytree(stranger, served)
    relative = os.path.relpath(copy / "metadata", config_dir() / "trust")
    document = json.loads((served / "metadata" / "1.root.json").read_text())
    document["signed"]["keys"][relative] = document["signed"]["keys"].pop(stranger_fingerprint)
    document["signed"]["roles"]["root"]["keyids"] = [relative]
    (served / "metadata" / "1.root.json").write_text(json.dumps(document))
    installed = installed_bundle_dir()
    with pytest.raises(InputError, match="is not a fingerprint \\(64 hex digits\\)"):
        pull(served)
    assert installed_bundle_dir() == installed
    assert sorted(path.name for path in (copy / "metadata").iterdir()) == before


def test_another_trusted_publishers_repository_does_not_replace_the_bundle_in_use(tmp_path: Path) -> None:
    """A mirror (or whoever sits on an http:// pull) served another publisher's genuine repository, one this
    device trusts, at the usual source: its bundle silently replaced the one in use."""
    first, first_fingerprint = publisher(tmp_path, "a")
    other, other_fingerprint = publisher(tmp_path, "b")
    pull(other, trust=other_fingerprint)  # trusted once, e.g. from a memory stick
    pull(first, trust=first_fingerprint)
    in_use = installed_bundle_dir()
    with pytest.raises(
        LocalpersError, match=f"but the bundle in use came from publisher {first_fingerprint}"
    ):
        pull(other)
    assert installed_bundle_dir() == in_use
    pull(first)  # its own publisher again: up to date
    switched = pull(other, trust=other_fingerprint)  # switching publishers is the user's word
    assert installed_bundle_dir() == switched.directory != in_use  # type: ignore[attr-defined]


def test_a_first_root_whose_root_key_is_missing_is_refused_in_one_line(tmp_path: Path) -> None:
    repository, fingerprint = publisher(tmp_path, "a")
    path = repository / "metadata" / "1.root.json"
    document = json.loads(path.read_text())
    del document["signed"]["keys"][fingerprint]
    path.write_text(json.dumps(document))
    with pytest.raises(InputError, match=f"its root key {fingerprint} is not in the file"):
        pull(repository, trust=fingerprint)
    assert nothing_installed()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://[::1", "not a valid http\\(s\\) URL"),
        ("http://[zz]/", "not a valid http\\(s\\) URL"),
        ("http://127.0.0.1:99999/", "not a valid http\\(s\\) URL"),
        ("http://someone:secret@127.0.0.1:1/", "with a user name or password is not supported"),
    ],
)
def test_a_malformed_url_is_one_line(url: str, message: str) -> None:
    with pytest.raises(InputError, match=message) as refused:
        pull(url)
    assert "secret" not in str(refused.value)


def test_the_pulled_bundle_given_by_its_current_link_is_read_as_its_version(tmp_path: Path) -> None:
    """`--bundle <cache>/bundles/current` kept the link: after the next pull this process read another version's
    files beside those it had verified."""
    repository, fingerprint = publisher(tmp_path, "a")
    pull(repository, trust=fingerprint)
    bundle = open_bundle(bundles_root() / "current", backbone_sha256=BACKBONE_SHA)
    assert bundle.directory == installed_bundle_dir()
    assert (bundle.directory.parent / f"{bundle.directory.name}.in-use").exists()  # held as the default is


def test_keygen_beside_a_link_to_nothing_writes_no_half_set(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    (keys / "targets.key").symlink_to(tmp_path / "elsewhere.key")
    with pytest.raises(LocalpersError, match="already holds key files \\(targets.key\\)"):
        generate_keys(keys)
    assert sorted(path.name for path in keys.iterdir()) == ["targets.key"]


@pytest.mark.skipif(os.name != "posix", reason="POSIX modes")
def test_keygen_refuses_a_folder_other_accounts_can_write(tmp_path: Path) -> None:
    keys = tmp_path / "shared"
    keys.mkdir()
    keys.chmod(0o777)
    with pytest.raises(InputError, match="can be written by other accounts \\(mode 777\\)"):
        generate_keys(keys)
    assert list(keys.iterdir()) == []


def test_the_prompt_is_not_offered_where_another_publishers_bundle_is_in_use(tmp_path: Path) -> None:
    """The terminal's question put the server's own key one `y` away from replacing the bundle in use, and did
    not say another publisher's bundle was in use (ninetieth session's trust audit): a hostile mirror at the usual
    address needed one keypress. Switching publishers takes --trust with the fingerprint from the publisher; the
    question stays for first contact, and for the in-use bundle's own publisher whose trust store was lost."""
    from localpers.bundle.trust import trust_store

    first, first_fingerprint = publisher(tmp_path, "a")
    other, other_fingerprint = publisher(tmp_path, "b")
    asked: list[str] = []
    pull(first, confirm_trust=lambda fingerprint: asked.append(fingerprint) or True)  # first contact: asked
    assert asked == [first_fingerprint]
    in_use = installed_bundle_dir()
    with pytest.raises(LocalpersError) as refused:
        pull(other, confirm_trust=lambda fingerprint: pytest.fail("asked to switch publishers"))
    message = str(refused.value)
    assert (
        f"signed by publisher key {other_fingerprint}, which this device does not trust, but the bundle in use"
        f" came from publisher {first_fingerprint}; nothing was installed" in message
    )
    assert "pull again with --trust and the fingerprint of the publisher you mean" in message
    assert f"--trust {other_fingerprint}" not in message and "\n" not in message
    assert installed_bundle_dir() == in_use and not trust_store(other_fingerprint).exists()
    shutil.rmtree(trust_store(first_fingerprint))  # the in-use bundle's publisher, its store lost: no switch
    pull(first, confirm_trust=lambda fingerprint: asked.append(fingerprint) or True)
    assert asked == [first_fingerprint, first_fingerprint]
    switched = pull(other, trust=other_fingerprint)  # the publisher's fingerprint, from them
    assert installed_bundle_dir() == switched.directory != in_use  # type: ignore[attr-defined]


def test_an_older_record_gets_its_publisher_on_an_up_to_date_pull(tmp_path: Path) -> None:
    """A record an older localpers wrote has no publisher, and an up-to-date pull kept it so: the binding never
    started on such a device until a new version came (session review)."""
    from localpers.bundle.record import record_path, recorded_publisher

    repository, fingerprint = publisher(tmp_path, "a")
    installed = pull(repository, trust=fingerprint).directory  # type: ignore[attr-defined]
    record = record_path(installed)
    older = json.loads(record.read_text())
    del older["publisher"]
    record.write_text(json.dumps(older))
    assert recorded_publisher(installed) is None
    assert pull(repository).unchanged  # type: ignore[attr-defined]
    assert recorded_publisher(installed) == fingerprint
