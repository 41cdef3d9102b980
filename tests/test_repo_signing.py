"""A publisher's repository under concurrent and interrupted commands (eighty-second session's audit of the bundle
path): one signing command at a time, and a rotation stopped halfway signs for the root devices walk to."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest
from test_serve_pull import make_bundle, publish
from test_signed_pull import pull

from localpers.bundle.keys import generate_keys
from localpers.bundle.repository import add_bundle
from localpers.bundle.repository_lock import repository_lock
from localpers.bundle.repository_metadata import load_repository
from localpers.bundle.resigning import refresh, rotate_keys
from localpers.bundle.rotation_pending import pending_role_files
from localpers.errors import LocalpersError


@pytest.fixture
def published(tmp_path: Path) -> tuple[Path, Path, str]:
    repo_dir, keys = tmp_path / "repo", tmp_path / "keys"
    return repo_dir, keys, publish(make_bundle(tmp_path / "bundle"), repo_dir, keys)


def test_a_refresh_waits_for_an_add_that_holds_the_repository(published: tuple[Path, Path, str]) -> None:
    """`repo refresh` beside `repo add` signed a timestamp naming one snapshot version with another's hash; both
    exited 0 and every new device refused the repository."""
    repo_dir, keys, _ = published
    before = load_repository(repo_dir).timestamp.signed.version
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with repository_lock(repo_dir):
            held.set()
            release.wait(timeout=20)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(timeout=5)
    refreshing = threading.Thread(target=refresh, args=(repo_dir, keys))
    refreshing.start()
    refreshing.join(timeout=1.0)
    try:
        assert refreshing.is_alive()  # waiting for the lock, nothing signed yet
        assert load_repository(repo_dir).timestamp.signed.version == before
    finally:
        release.set()
        holder.join()
        refreshing.join(timeout=20)
    assert not refreshing.is_alive() and load_repository(repo_dir).timestamp.signed.version == before + 1


def stopped_rotation(tmp_path: Path, repo_dir: Path, keys: Path, files: tuple[str, ...]) -> Path:
    """New keys, and a rotation to them stopped (as by a kill) once it has written `files` of the new root (its
    record of the role files it verified is left in the new keys' folder, as a kill leaves it)."""
    from localpers.bundle import resigning

    new_keys = tmp_path / "new-keys"
    generate_keys(new_keys)
    written: list[str] = []
    write = resigning.write_public

    def killed_after_files(path: Path, data: bytes) -> None:
        if tuple(written) == files:
            raise KeyboardInterrupt
        write(path, data)
        written.append(path.name)

    def killed(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(resigning, "write_public", killed_after_files)
        patched.setattr(resigning, "publish_targets", killed)
        with pytest.raises(KeyboardInterrupt):
            rotate_keys(repo_dir, keys, new_keys)
    assert tuple(written) == files
    return new_keys


def test_a_rotation_stopped_after_its_numbered_root_refuses_the_old_keys(
    tmp_path: Path, published: tuple[Path, Path, str]
) -> None:
    """Stopped after `2.root.json` and before `root.json`: `repo add --keys OLD` read root.json, signed with keys
    the root devices fetch no longer trusts, and exited 0; every device then refused the repository."""
    repo_dir, keys, _ = published
    new_keys = stopped_rotation(tmp_path, repo_dir, keys, ("2.root.json",))
    assert (
        load_repository(
            repo_dir, pending=pending_role_files(new_keys, repo_dir / "metadata")
        ).root.signed.version
        == 2
    )
    with pytest.raises(LocalpersError, match="if a key rotation was stopped, finish it with"):
        add_bundle(repo_dir, make_bundle(tmp_path / "next", seed="next"), keys)


def test_a_rotation_stopped_before_re_signing_says_how_to_finish_it(
    tmp_path: Path, published: tuple[Path, Path, str]
) -> None:
    repo_dir, keys, fingerprint = published
    pull(repo_dir, trust=fingerprint)  # a device that trusts the first root
    new_keys = stopped_rotation(tmp_path, repo_dir, keys, ("2.root.json", "root.json"))
    with pytest.raises(LocalpersError, match=f"`localpers repo refresh {repo_dir} --all --keys"):
        rotate_keys(repo_dir, keys, new_keys)
    refresh(repo_dir, new_keys, everything=True)
    pull(repo_dir)  # the device follows the rotation


def test_an_init_stopped_halfway_can_be_run_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stopped `repo init` left a root.json: init then said "already a repository" and `repo add` "not a
    repository", and only deleting the folder by hand mended it."""
    from localpers.bundle import repository
    from localpers.bundle.repository import init_repository
    from localpers.bundle.repository_metadata import is_repository

    keys, repo_dir = tmp_path / "keys", tmp_path / "repo"
    generate_keys(keys)

    def stopped(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(repository, "_publish_snapshot_and_timestamp", stopped)
        with pytest.raises(KeyboardInterrupt):
            init_repository(repo_dir, keys)
    assert not is_repository(repo_dir) and not (repo_dir / "metadata" / "root.json").exists()
    init_repository(repo_dir, keys)
    add_bundle(repo_dir, make_bundle(tmp_path / "bundle"), keys)
    assert load_repository(repo_dir).targets.signed.version == 2
    assert not list(repo_dir.glob(".metadata-*"))


def test_init_warns_when_its_keys_already_sign_another_repository(tmp_path: Path) -> None:
    """A repository made again with the same keys (after losing the first) locked out every device that trusted
    the first, as a rollback, and nothing said so."""
    from typer.testing import CliRunner

    from localpers.cli import app

    keys = tmp_path / "keys"
    generate_keys(keys)
    runner = CliRunner()
    first = runner.invoke(app, ["repo", "init", str(tmp_path / "first"), "--keys", str(keys)])
    assert first.exit_code == 0 and "warning" not in first.stderr
    second = runner.invoke(app, ["repo", "init", str(tmp_path / "second"), "--keys", str(keys)])
    assert second.exit_code == 0
    assert f"already sign the repository {(tmp_path / 'first').resolve()}" in second.stderr
    assert "refuses a new repository made with the same keys as a rollback" in second.stderr


def test_a_folder_that_is_not_a_repository_is_refused_without_a_lock_left_in_it(tmp_path: Path) -> None:
    """The lock was taken first: `repo refresh` on a mistyped path said "cannot lock the repository (No such file
    or directory)" instead of "not a repository", and on any other folder it left a `.repo.lock` (session review)."""
    keys = tmp_path / "keys"
    generate_keys(keys)
    with pytest.raises(LocalpersError, match="not a repository: create one with `localpers repo init`"):
        refresh(tmp_path / "no-such-folder", keys)
    other = tmp_path / "photos"
    other.mkdir()
    with pytest.raises(LocalpersError, match="not a repository"):
        refresh(other, keys)
    assert list(other.iterdir()) == []


def test_publishing_adds_read_bits_and_keeps_a_shared_groups_write(
    tmp_path: Path, published: tuple[Path, Path, str]
) -> None:
    """Every `repo add` set exact modes, taking group write (and setgid) from a folder a publishing team shares."""
    repo_dir, keys, _ = published
    targets = repo_dir / "targets" / "bundle"
    targets.chmod(0o2775)
    add_bundle(repo_dir, make_bundle(tmp_path / "next", seed="next"), keys)
    assert stat.S_IMODE(targets.stat().st_mode) == 0o2775


def test_a_root_renewed_after_a_stopped_rotation_can_still_be_finished(
    tmp_path: Path, published: tuple[Path, Path, str]
) -> None:
    """A rotation stopped before re-signing, then `refresh --root` (root 3, the new keys): the metadata check took
    the roles still signed by the old keys for a stranger's, and refused the documented repair (session review)."""
    repo_dir, keys, fingerprint = published
    pull(repo_dir, trust=fingerprint)
    new_keys = stopped_rotation(tmp_path, repo_dir, keys, ("2.root.json", "root.json"))
    refresh(repo_dir, new_keys, root=True)
    refresh(repo_dir, new_keys, everything=True)
    pull(repo_dir)  # the device follows both roots
