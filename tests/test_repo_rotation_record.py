"""A key rotation's record (eighty-eighth session): the rotated-out keys sign nothing the publisher's commands carry
forward, except the role files a stopped rotation verified and left for its finishing command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_repo_signing import stopped_rotation
from test_serve_pull import make_bundle, publish
from test_signed_pull import pull

from localpers.bundle.keys import generate_keys, load_signer
from localpers.bundle.repository import add_bundle
from localpers.bundle.repository_metadata import load_repository
from localpers.bundle.resigning import refresh, rotate_keys
from localpers.bundle.rotation_pending import PENDING_FILE, pending_role_files
from localpers.errors import InputError


@pytest.fixture
def published(tmp_path: Path) -> tuple[Path, Path, str]:
    repo_dir, keys = tmp_path / "repo", tmp_path / "keys"
    return repo_dir, keys, publish(make_bundle(tmp_path / "bundle"), repo_dir, keys)


def forge_targets(repo_dir: Path, keys: Path, pending: dict[str, str] | None = None) -> bytes:
    """targets.json at the next version with one target's hash changed, signed by the targets key in `keys`."""
    forged = load_repository(repo_dir, pending=pending).targets
    forged.signed.version += 1
    next(iter(forged.signed.targets.values())).hashes["sha256"] = "0" * 64
    forged.signatures.clear()
    forged.sign(load_signer(keys, "targets"))
    (repo_dir / "metadata" / "targets.json").write_bytes(forged.to_bytes())
    return forged.to_bytes()


def test_right_after_a_finished_rotation_the_old_keys_sign_nothing_carried_forward(
    published: tuple[Path, Path, str], tmp_path: Path
) -> None:
    # the roles the previous root's keys signed were taken while the newest root was the one that rotated them,
    # and `refresh --all` took those any root of the chain trusted: whoever held the rotated-out (leaked) keys and
    # could write the folder had the new keys sign their targets
    repo_dir, keys, _ = published
    new_keys = tmp_path / "new-keys"
    generate_keys(new_keys)
    rotate_keys(repo_dir, keys, new_keys)
    assert not (new_keys / PENDING_FILE).exists()  # finished: nothing left to accept
    forge_targets(repo_dir, keys)
    with pytest.raises(InputError, match=r"targets.json: not signed by this repository's targets key"):
        add_bundle(repo_dir, make_bundle(tmp_path / "next", seed="next"), new_keys)
    with pytest.raises(InputError, match=r"targets.json: not signed by this repository's targets key"):
        refresh(repo_dir, new_keys, everything=True)


def test_a_stopped_rotation_finishes_only_with_the_files_it_verified(
    published: tuple[Path, Path, str], tmp_path: Path
) -> None:
    repo_dir, keys, fingerprint = published
    pull(repo_dir, trust=fingerprint)
    new_keys = stopped_rotation(tmp_path, repo_dir, keys, ("2.root.json", "root.json"))
    pending = pending_role_files(new_keys, repo_dir / "metadata")
    assert set(pending) == {"targets.json", "snapshot.json", "timestamp.json"}
    targets = repo_dir / "metadata" / "targets.json"
    verified = targets.read_bytes()
    forge_targets(
        repo_dir, keys, pending
    )  # the old keys sign another targets.json before the rotation is finished
    with pytest.raises(InputError, match=r"targets.json: not signed by this repository's targets key"):
        refresh(repo_dir, new_keys, everything=True)
    targets.write_bytes(verified)
    refresh(repo_dir, new_keys, everything=True)
    assert not (new_keys / PENDING_FILE).exists()
    pull(repo_dir)  # the device follows the rotation
    forge_targets(repo_dir, keys)  # and once it is finished the old keys sign nothing at all
    with pytest.raises(InputError, match=r"targets.json: not signed"):
        refresh(repo_dir, new_keys, everything=True)


def test_a_record_of_another_repository_neither_applies_nor_is_cleared(
    published: tuple[Path, Path, str], tmp_path: Path
) -> None:
    repo_dir, keys, _ = published
    new_keys = stopped_rotation(tmp_path, repo_dir, keys, ("2.root.json", "root.json"))
    record = json.loads((new_keys / PENDING_FILE).read_text())
    ((this_root, rotation),) = record["rotations"].items()
    another = {
        "root_version": 2,
        "role_files": {"targets.json": "1" * 64},
    }  # a root this repository does not hold
    (new_keys / PENDING_FILE).write_text(json.dumps({"rotations": {"f" * 64: rotation}}))
    with pytest.raises(InputError, match=r"rotation-pending.json records no rotation of this repository"):
        refresh(repo_dir, new_keys, everything=True)
    (new_keys / PENDING_FILE).write_text(json.dumps({"rotations": {this_root: rotation, "f" * 64: another}}))
    refresh(repo_dir, new_keys, everything=True)
    assert json.loads((new_keys / PENDING_FILE).read_text()) == {"rotations": {"f" * 64: another}}


def test_a_stopped_rotation_is_finished_wherever_the_folder_went(
    published: tuple[Path, Path, str], tmp_path: Path
) -> None:
    # the record named the folder's path: moved, renamed or mounted elsewhere, the rotation could not be finished,
    # and the refusal advised the very command that failed (session review)
    repo_dir, keys, fingerprint = published
    pull(repo_dir, trust=fingerprint)
    new_keys = stopped_rotation(tmp_path, repo_dir, keys, ("2.root.json", "root.json"))
    moved = tmp_path / "moved-repo"
    repo_dir.rename(moved)
    refresh(moved, new_keys, everything=True)
    assert not (new_keys / PENDING_FILE).exists()
    pull(moved)


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b'{"rotations": {"ab": {"root_version": 2, "role_files": {"root.json": "x"}}}}',
        b'{"rotations": {"ab": {"root_version": true, "role_files": {}}}}',
        b"\xff\xfe",
    ],
)
def test_a_damaged_record_is_one_line_naming_it(
    published: tuple[Path, Path, str], tmp_path: Path, content: bytes
) -> None:
    repo_dir, keys, _ = published
    new_keys = stopped_rotation(tmp_path, repo_dir, keys, ("2.root.json", "root.json"))
    (new_keys / PENDING_FILE).write_bytes(content)
    with pytest.raises(InputError, match=rf"{PENDING_FILE}: .*run `localpers repo rotate` again") as raised:
        refresh(repo_dir, new_keys, everything=True)
    assert "\n" not in str(raised.value)


def test_renewing_the_root_of_a_stopped_rotation_reports_its_expiry(
    published: tuple[Path, Path, str], tmp_path: Path
) -> None:
    # the expiry report after a signing command loaded the repository as `repo add` does, and refused the roles
    # a stopped rotation left: `refresh --root` signed, then ended in that error
    from typer.testing import CliRunner

    from localpers.cli import app

    repo_dir, keys, _ = published
    new_keys = stopped_rotation(tmp_path, repo_dir, keys, ("2.root.json", "root.json"))
    result = CliRunner().invoke(app, ["repo", "refresh", str(repo_dir), "--keys", str(new_keys), "--root"])
    assert result.exit_code == 0, result.output
    assert "expires (UTC): root" in result.output
    assert (repo_dir / "metadata" / "3.root.json").exists()


def test_a_rotation_to_keys_the_repository_already_trusts_is_refused_writing_nothing(
    published: tuple[Path, Path, str], tmp_path: Path
) -> None:
    """The keys in use given as --new-keys (the same folder, or a new root key beside the old, perhaps leaked,
    targets and timestamp keys) were "rotated" to, exit 0, "now trusts only the keys in ...": the keys a
    rotation was made to retire kept their power (ninetieth session's trust audit)."""
    import shutil

    from typer.testing import CliRunner

    from localpers.cli import app

    repo_dir, keys, _ = published
    half = tmp_path / "half"
    generate_keys(half)
    for name in ("targets.key", "targets.pub.json", "timestamp.key", "timestamp.pub.json"):
        shutil.copyfile(keys / name, half / name)
    files = {path: path.read_bytes() for path in sorted(repo_dir.rglob("*")) if path.is_file()}
    key_files = {path: path.read_bytes() for path in sorted([*keys.iterdir(), *half.iterdir()])}
    for new_keys, role in ((keys, "root"), (half, "targets")):
        result = CliRunner().invoke(
            app, ["repo", "rotate", str(repo_dir), "--keys", str(keys), "--new-keys", str(new_keys)]
        )
        assert result.exit_code == 2, result.output
        assert result.stderr.count("\n") == 1
        assert f"{new_keys}: its {role} key is one {repo_dir}" in result.stderr
        assert "already trusts (as its" in result.stderr
    assert {path: path.read_bytes() for path in sorted(repo_dir.rglob("*")) if path.is_file()} == files
    assert {path: path.read_bytes() for path in sorted([*keys.iterdir(), *half.iterdir()])} == key_files
