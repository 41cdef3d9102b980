"""Signed bundle updates (TUF): what `pull` trusts and what it refuses before anything is installed.

Every repository here is signed with throwaway keys made in the test's tmp dir; the demo publisher's
private keys are never needed (only its shipped root is checked).
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import shutil
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from synthetic_bundle import make_bundle as make_real_bundle
from test_serve_pull import BACKBONE_SHA, FILES, make_bundle, publish, request
from typer.testing import CliRunner

from localpers.bundle.format import MANIFEST_NAME
from localpers.bundle.keys import generate_keys
from localpers.bundle.locations import bundles_root, installed_bundle_dir
from localpers.bundle.pull import pull_bundle
from localpers.bundle.repository import add_bundle, init_repository, root_keyid
from localpers.bundle.resigning import refresh, rotate_keys
from localpers.bundle.trust import demo_root_bytes, root_fingerprint, trust_store
from localpers.cli import app
from localpers.engine.backbone import Backbone
from localpers.errors import InputError, LocalpersError

runner = CliRunner()


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, Path, str]:
    """(repository, keys, fingerprint) with one bundle published."""
    repo_dir, keys = tmp_path / "repo", tmp_path / "keys"
    fingerprint = publish(make_bundle(tmp_path / "bundle"), repo_dir, keys)
    return repo_dir, keys, fingerprint


def nothing_installed() -> bool:
    root = bundles_root()
    versions = root / "versions"
    leftovers = [p for p in root.iterdir() if p.name.startswith(".staging-")]
    return (
        installed_bundle_dir() is None
        and not leftovers
        and not (versions.exists() and any(versions.iterdir()))
    )


def pull(source: Path | str, **kwargs: object) -> object:
    return pull_bundle(str(source), backbone_sha256=BACKBONE_SHA, **kwargs)  # type: ignore[arg-type]


# -- whom a device trusts -----------------------------------------------------------------------------


def test_an_unknown_publisher_is_refused_until_its_fingerprint_is_given(repo: tuple[Path, Path, str]) -> None:
    repo_dir, _, fingerprint = repo
    with pytest.raises(
        LocalpersError, match=f"publisher key {fingerprint}, which this device does not trust"
    ) as first_contact:
        pull(repo_dir)
    # The server's key is shown to be compared with the publisher's, never offered as a command to paste.
    assert "compare it with the fingerprint your publisher gave you another way" in str(first_contact.value)
    assert f"--trust {fingerprint}" not in str(first_contact.value)
    with pytest.raises(LocalpersError, match="not " + "0" * 64):
        pull(repo_dir, trust="0" * 64)
    assert nothing_installed() and not trust_store(fingerprint).exists()
    pull(repo_dir, trust=fingerprint)
    assert (trust_store(fingerprint) / "root.json").exists()
    pull(repo_dir)  # stored: no --trust needed again


def test_an_unsigned_bundle_directory_needs_unsigned(tmp_path: Path, repo: tuple[Path, Path, str]) -> None:
    with pytest.raises(LocalpersError, match="unsigned bundle directory.*--unsigned"):
        pull(make_bundle(tmp_path / "plain"))
    with pytest.raises(LocalpersError, match="--unsigned applies only to a local bundle directory"):
        pull(repo[0], unsigned=True)
    assert nothing_installed()


def test_an_empty_source_is_refused_not_read_as_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(make_bundle(tmp_path / "plain"))  # a bundle here must not be what '' names
    for blank in ("", "  "):
        with pytest.raises(InputError, match="the source is empty"):
            pull(blank, unsigned=True)
    assert nothing_installed()


def test_an_attackers_self_consistent_repository_is_refused(
    tmp_path: Path, repo: tuple[Path, Path, str]
) -> None:
    """F8: re-hashed, self-consistent metadata and adapters signed with the attacker's own keys."""
    repo_dir, _, fingerprint = repo
    pull(repo_dir, trust=fingerprint)
    installed = installed_bundle_dir()
    evil = tmp_path / "evil"
    publish(make_bundle(tmp_path / "evil-bundle", seed="evil"), evil, tmp_path / "evil-keys")
    with pytest.raises(LocalpersError, match="does not trust"):
        pull(evil)
    # The same, keeping the real publisher's 1.root.json so it claims the trusted fingerprint.
    shutil.copyfile(repo_dir / "metadata/1.root.json", evil / "metadata/1.root.json")
    with pytest.raises(InputError, match="signed metadata refused"):
        pull(evil)
    assert installed_bundle_dir() == installed


def repository_claiming_the_demo_publisher(tmp_path: Path) -> Path:
    """Another key's repository whose first root is the shipped demo root (its later metadata is not signed by it)."""
    evil = tmp_path / "evil"
    publish(make_bundle(tmp_path / "evil-bundle", seed="evil"), evil, tmp_path / "evil-keys")
    (evil / "metadata/1.root.json").write_bytes(demo_root_bytes())
    return evil


def test_a_repository_claiming_the_demo_publisher_is_checked_against_the_shipped_root(tmp_path: Path) -> None:
    fingerprint = root_fingerprint(demo_root_bytes(), "demo")
    evil = repository_claiming_the_demo_publisher(tmp_path)
    with pytest.raises(InputError, match="signed metadata refused"):
        pull(evil)
    assert nothing_installed()
    assert trust_store(fingerprint).exists()  # seeded from the package, not from the server


def test_a_damaged_stored_demo_root_starts_again_from_the_shipped_one(tmp_path: Path) -> None:
    # it was refused with "delete the folder and pull again with --trust": a fingerprint the device ships with
    demo = demo_root_bytes()
    fingerprint = root_fingerprint(demo, "demo")
    evil = repository_claiming_the_demo_publisher(tmp_path)
    with pytest.raises(InputError, match="signed metadata refused"):
        pull(evil)  # the store is made from the package
    (trust_store(fingerprint) / "root.json").write_bytes(b'{"signed": {"_type": "root"')  # a write cut short
    with pytest.raises(InputError, match="signed metadata refused"):
        pull(evil)
    assert (trust_store(fingerprint) / "root.json").read_bytes() == demo
    assert nothing_installed()


def test_the_shipped_demo_root_is_self_signed_and_not_about_to_expire() -> None:
    from tuf.api.metadata import Metadata, Root

    root = Metadata[Root].from_bytes(demo_root_bytes())
    root.signed.verify_delegate("root", root.signed_bytes, root.signatures)
    assert root.signed.expires > datetime.now(UTC) + timedelta(days=30)
    assert root.signed.consistent_snapshot


# -- what TUF refuses ---------------------------------------------------------------------------------


def test_tampered_metadata_is_refused(repo: tuple[Path, Path, str]) -> None:
    repo_dir, _, fingerprint = repo
    timestamp = repo_dir / "metadata/timestamp.json"
    document = json.loads(timestamp.read_text())
    document["signed"]["expires"] = "2099-01-01T00:00:00Z"  # not re-signed
    timestamp.write_text(json.dumps(document))
    with pytest.raises(InputError, match="metadata/timestamp.json: signed metadata refused") as refused:
        pull(repo_dir, trust=fingerprint)
    assert "nothing was installed: it is damaged, or not signed by the keys this device trusts" in str(
        refused.value
    )  # the raw TUF error alone said neither (publisher audit)
    assert nothing_installed()
    timestamp.unlink()  # a repository copied without it: trying again finds the same
    with pytest.raises(
        LocalpersError, match="timestamp.json: the repository has no such file .*upload the whole"
    ):
        pull(repo_dir, trust=fingerprint)
    assert nothing_installed()


def test_a_tampered_target_is_refused(repo: tuple[Path, Path, str]) -> None:
    repo_dir, _, fingerprint = repo
    (adapter,) = (repo_dir / "targets/bundle/adapters").glob("*.global.gguf")
    adapter.write_bytes(b"evil" + adapter.read_bytes()[4:])
    with pytest.raises(InputError, match="adapters/global.gguf.*signed length or hash"):
        pull(repo_dir, trust=fingerprint)
    assert nothing_installed()


def test_rollback_to_older_metadata_is_refused(tmp_path: Path, repo: tuple[Path, Path, str]) -> None:
    repo_dir, keys, fingerprint = repo
    old = tmp_path / "old-copy"
    shutil.copytree(repo_dir, old)
    add_bundle(repo_dir, make_bundle(tmp_path / "newer", seed="newer"), keys)
    newer = pull(repo_dir, trust=fingerprint)
    with pytest.raises(InputError, match="refusing a rollback"):
        pull(old)
    assert installed_bundle_dir() == newer.directory.resolve()  # type: ignore[attr-defined]


def days_around(days: int) -> set[str]:
    """The UTC date `days` from now, as printed, either side of a midnight the test might cross."""
    return {(datetime.now(UTC) + timedelta(days=days, minutes=m)).strftime("%Y-%m-%d") for m in (-5, 5)}


def test_an_expired_timestamp_is_refused_until_refreshed(repo: tuple[Path, Path, str]) -> None:
    repo_dir, keys, fingerprint = repo
    refresh(repo_dir, keys, {"timestamp": -1})
    with pytest.raises(
        InputError, match=r"timestamp.json: .*signed timestamp metadata has expired"
    ) as refused:
        pull(repo_dir, trust=fingerprint)
    # the device's clock is named (it may be the thing that is wrong), and the publisher's mend
    assert any(f"this device's clock ({day}" in str(refused.value) for day in days_around(0))
    assert str(refused.value).endswith("`localpers repo refresh`")
    assert nothing_installed()
    refresh(repo_dir, keys)
    pull(repo_dir, trust=fingerprint)


def test_an_expired_root_is_refused_until_renewed_with_the_same_keys(repo: tuple[Path, Path, str]) -> None:
    repo_dir, keys, fingerprint = repo
    pull(repo_dir, trust=fingerprint)
    versions = refresh(repo_dir, keys, {"root": -1}, root=True)  # a root past its year
    assert versions["root"] == 2
    with pytest.raises(
        InputError, match=r"metadata/root.json: .*signed root metadata has expired"
    ) as refused:
        pull(repo_dir)
    assert str(refused.value).endswith("`localpers repo refresh --root --all`")
    refresh(repo_dir, keys, root=True, everything=True)  # what the message asks for: version 3, same keys
    pull(repo_dir)
    assert root_keyid(repo_dir) == fingerprint


def test_repo_commands_print_expiry_dates_and_warn_before_the_root_expires(
    repo: tuple[Path, Path, str],
) -> None:
    repo_dir, keys, _ = repo
    refresh(repo_dir, keys, {"root": 10}, root=True)
    refreshed = runner.invoke(app, ["repo", "refresh", str(repo_dir), "--keys", str(keys)])
    assert refreshed.exit_code == 0, refreshed.output
    assert any(f"expires (UTC): root {day}" in refreshed.stdout for day in days_around(10))
    assert "root of" in refreshed.stderr and "expires in 9 days" in refreshed.stderr
    assert "--root` (needs root.key)" in refreshed.stderr
    quiet = runner.invoke(app, ["repo", "refresh", str(repo_dir), "--keys", str(keys), "--json"])
    assert "expires in 9 days" in quiet.stderr  # --json too: a cron job's mail shows it
    refused = runner.invoke(
        app, ["repo", "refresh", str(repo_dir), "--keys", str(keys), "--root-days", "700"]
    )
    assert refused.exit_code == 2 and "give it with --root" in refused.stderr
    renewed = runner.invoke(
        app, ["repo", "refresh", str(repo_dir), "--keys", str(keys), "--root", "--root-days", "700", "--json"]
    )
    assert renewed.exit_code == 0, renewed.output
    shown = json.loads(renewed.stdout)
    later = datetime.strptime(shown["expires"]["root"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert shown["root"] == 3 and abs((later - datetime.now(UTC)).days - 700) <= 1 and not renewed.stderr
    new_keys = repo_dir.parent / "new-keys"  # the keys in use are refused as new ones
    generate_keys(new_keys)
    rotated = runner.invoke(
        app, ["repo", "rotate", str(repo_dir), "--keys", str(keys), "--new-keys", str(new_keys)]
    )
    assert rotated.exit_code == 0 and "expires (UTC): root " in rotated.stdout, rotated.output


def test_a_timestamp_refresh_warns_when_the_snapshot_it_cannot_renew_runs_out(
    repo: tuple[Path, Path, str],
) -> None:
    """The documented cron job (timestamp only) cannot re-sign the snapshot, which expired after 30 days without a
    word; then every device refused the repository (audit85)."""
    repo_dir, keys, _ = repo
    refresh(repo_dir, keys, {"snapshot": 3}, everything=True)
    refreshed = runner.invoke(app, ["repo", "refresh", str(repo_dir), "--keys", str(keys)])
    assert refreshed.exit_code == 0, refreshed.output
    assert f"snapshot metadata of {repo_dir} expires in 3 days, before the timestamp does" in refreshed.stderr
    assert "--all` (needs targets.key and snapshot.key)" in refreshed.stderr
    renewed = runner.invoke(app, ["repo", "refresh", str(repo_dir), "--keys", str(keys), "--all"])
    assert renewed.exit_code == 0 and "snapshot metadata" not in renewed.stderr, renewed.output


def test_repo_days_beyond_a_century_is_a_usage_error(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    generate_keys(keys)
    refused = runner.invoke(
        app, ["repo", "init", str(tmp_path / "repo"), "--keys", str(keys), "--days", "3000000"]
    )
    assert refused.exit_code == 2 and "36500" in refused.output
    assert not (tmp_path / "repo").exists()


def test_mix_and_match_of_metadata_versions_is_refused(tmp_path: Path, repo: tuple[Path, Path, str]) -> None:
    repo_dir, keys, fingerprint = repo
    add_bundle(repo_dir, make_bundle(tmp_path / "newer", seed="newer"), keys)
    metadata = repo_dir / "metadata"
    newest = max(int(p.name.split(".")[0]) for p in metadata.glob("*.targets.json"))
    # Serve the older (validly signed) targets under the version the snapshot names.
    shutil.copyfile(metadata / f"{newest - 1}.targets.json", metadata / f"{newest}.targets.json")
    with pytest.raises(InputError, match=f"metadata/{newest}.targets.json: a file does not match its signed"):
        pull(repo_dir, trust=fingerprint)
    assert nothing_installed()


def test_a_damaged_trusted_root_on_this_device_is_a_one_line_error(repo: tuple[Path, Path, str]) -> None:
    repo_dir, _, fingerprint = repo
    pull(repo_dir, trust=fingerprint)
    (trust_store(fingerprint) / "root.json").write_text("{not json")
    with pytest.raises(
        InputError, match=f"{fingerprint}/root.json: this device's trusted root for publisher"
    ):
        pull(repo_dir)


def test_key_rotation_is_followed_and_old_keys_lose_power(
    tmp_path: Path, repo: tuple[Path, Path, str]
) -> None:
    repo_dir, keys, fingerprint = repo
    pull(repo_dir, trust=fingerprint)
    stale = tmp_path / "before-rotation"
    shutil.copytree(repo_dir, stale)
    new_keys = tmp_path / "new-keys"
    generate_keys(new_keys)
    assert rotate_keys(repo_dir, keys, new_keys) == 2
    add_bundle(repo_dir, make_bundle(tmp_path / "after", seed="after"), new_keys)
    after = pull(repo_dir)
    stored = json.loads((trust_store(fingerprint) / "root.json").read_text())
    assert stored["signed"]["version"] == 2
    # Metadata still signed with the replaced keys is no longer accepted.
    add_bundle(stale, make_bundle(tmp_path / "stale", seed="stale"), keys)
    with pytest.raises(InputError):
        pull(stale)
    assert installed_bundle_dir() == after.directory.resolve()  # type: ignore[attr-defined]


def test_after_a_rotation_every_message_names_the_fingerprint_devices_pin(
    tmp_path: Path, repo: tuple[Path, Path, str]
) -> None:
    """Publisher audit: `repo keygen NEW` printed "root fingerprint X", and after rotating to NEW nothing said that
    devices still pin the repository's first fingerprint; a new device given X was refused without a hint."""
    repo_dir, keys, first = repo
    new_keys = tmp_path / "new-keys"
    made = runner.invoke(app, ["repo", "keygen", str(new_keys)])
    assert made.exit_code == 0 and "the fingerprint devices pin once `localpers repo init`" in made.output
    new_root = json.loads((new_keys / "root.pub.json").read_text())["keyid"]
    rotated = runner.invoke(
        app, ["repo", "rotate", str(repo_dir), "--keys", str(keys), "--new-keys", str(new_keys)]
    )
    assert rotated.exit_code == 0, rotated.output
    assert f"New devices still pin the repository's first fingerprint, {first}" in rotated.output
    with pytest.raises(LocalpersError, match="keeps the fingerprint of its first root"):
        pull(repo_dir, trust=new_root)
    assert pull(repo_dir, trust=first).files == len(FILES)  # type: ignore[attr-defined]


# -- hosting: plain static files ----------------------------------------------------------------------


@pytest.fixture
def static_host(repo: tuple[Path, Path, str]) -> Iterator[str]:
    """The repository served by Python's plain static file server: no localpers code on the host."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(repo[0]))
    handler.log_message = lambda *args, **kwargs: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_a_repository_on_any_static_host_can_be_pulled(
    static_host: str, repo: tuple[Path, Path, str]
) -> None:
    result = pull(static_host, trust=repo[2])
    assert result.files == len(FILES)  # type: ignore[attr-defined]
    assert (result.directory / MANIFEST_NAME).is_file()  # type: ignore[attr-defined]


def cutting_host(directory: Path, cut: str, keep: int) -> tuple[http.server.ThreadingHTTPServer, str]:
    """`directory` served statically, except that files whose URL contains `cut` stop after `keep` bytes of
    their announced length: the connection closes as when a server stops mid-download."""

    class CutShort(http.server.SimpleHTTPRequestHandler):
        def copyfile(self, source: Any, outputfile: Any) -> None:
            if cut in self.path:
                outputfile.write(source.read(keep))
                self.close_connection = True
                return
            super().copyfile(source, outputfile)

        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(CutShort, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def test_a_download_cut_short_is_a_network_failure_not_tampering(repo: tuple[Path, Path, str]) -> None:
    repo_dir, _, fingerprint = repo
    server, url = cutting_host(repo_dir, "global.gguf", 30_000)
    try:
        with pytest.raises(LocalpersError) as caught:
            pull(url, trust=fingerprint)
    finally:
        server.shutdown()
        server.server_close()
    assert caught.value.exit_code == 1 and not isinstance(caught.value, InputError)
    assert "the connection closed after 30000 bytes of 70000 bytes of " in str(caught.value)
    assert "global.gguf; try again" in str(caught.value) and "tampered" not in str(caught.value)
    assert nothing_installed()


def test_a_backbone_download_cut_short_keeps_its_partial_for_the_next_pull(
    repo_with_backbone: tuple[Path, str, bytes],
) -> None:
    import hashlib

    from localpers.engine.backbone import pulled_backbone_path

    repo_dir, fingerprint, data = repo_with_backbone
    sha = hashlib.sha256(data).hexdigest()
    server, url = cutting_host(repo_dir, "targets/backbone/", 1 << 20)
    try:
        with pytest.raises(
            LocalpersError, match=r"closed after 1\.0 MB of 3\.1 MB .*pull again to resume"
        ) as caught:
            pull_bundle(url, with_backbone=True, trust=fingerprint)
    finally:
        server.shutdown()
        server.server_close()
    assert caught.value.exit_code == 1
    partial = pulled_backbone_path(sha).with_name(pulled_backbone_path(sha).name + ".partial")
    assert partial.read_bytes() == data[: 1 << 20] and nothing_installed()
    pull_bundle(str(repo_dir), with_backbone=True)
    assert pulled_backbone_path(sha).read_bytes() == data


# -- the publisher's commands -------------------------------------------------------------------------


def test_repo_commands_end_to_end(tmp_path: Path, backbone: Backbone) -> None:
    keys, repo_dir = tmp_path / "keys", tmp_path / "repo"
    bundle = make_real_bundle(tmp_path / "bundle", backbone)  # `pull` reads the content as a device would
    created = runner.invoke(app, ["repo", "keygen", str(keys)])
    assert created.exit_code == 0, created.output
    assert (keys / "root.key").stat().st_mode & 0o077 == 0
    assert runner.invoke(app, ["repo", "keygen", str(keys)]).exit_code == 1  # never overwrites keys
    assert runner.invoke(app, ["repo", "init", str(repo_dir), "--keys", str(keys)]).exit_code == 0
    assert runner.invoke(app, ["repo", "add", str(repo_dir), str(bundle), "--keys", str(keys)]).exit_code == 0
    assert not any(p.suffix == ".key" for p in repo_dir.rglob("*"))
    shown = runner.invoke(app, ["repo", "fingerprint", str(repo_dir)])
    fingerprint = shown.stdout.strip()
    assert fingerprint == root_keyid(repo_dir) and fingerprint in created.stdout
    refreshed = runner.invoke(app, ["repo", "refresh", str(repo_dir), "--keys", str(keys)])
    assert refreshed.exit_code == 0 and "re-signed the timestamp of" in refreshed.stdout
    assert "timestamp 3" in refreshed.stdout
    refreshed = runner.invoke(app, ["repo", "refresh", str(repo_dir), "--keys", str(keys), "--json"])
    assert refreshed.exit_code == 0 and json.loads(refreshed.stdout)["timestamp"] == 4
    pulled = runner.invoke(
        app, ["pull", str(repo_dir), "--trust", fingerprint, "--model", str(backbone.path), "--json"]
    )
    assert pulled.exit_code == 0, pulled.output
    assert json.loads(pulled.stdout)["files"] == len(
        json.loads((bundle / MANIFEST_NAME).read_text())["files"]
    )


def test_init_refuses_an_existing_repository(repo: tuple[Path, Path, str]) -> None:
    with pytest.raises(LocalpersError, match="already a repository"):
        init_repository(repo[0], repo[1])


def test_init_refuses_a_file_and_a_folder_holding_other_files(
    tmp_path: Path, repo: tuple[Path, Path, str]
) -> None:
    """Publisher audit: `repo init afile` said "Not a directory (afile/metadata)", and `repo init` of a folder
    holding other files made a repository there, whose stray files the documented rsync uploads."""
    keys = repo[1]
    (tmp_path / "afile").write_text("x\n")
    made = runner.invoke(app, ["repo", "init", str(tmp_path / "afile"), "--keys", str(keys)])
    assert_one_line_refusal(made, "afile is a file, not a folder; give a new or empty folder")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("drafts\n")
    (busy / ".git").mkdir()  # hidden entries (a version control folder) are no bar
    made = runner.invoke(app, ["repo", "init", str(busy), "--keys", str(keys)])
    assert_one_line_refusal(
        made, "already holds notes.txt", "everything in a repository's folder is uploaded"
    )
    assert sorted(p.name for p in busy.iterdir()) == [".git", "notes.txt"]
    (busy / "notes.txt").unlink()
    assert runner.invoke(app, ["repo", "init", str(busy), "--keys", str(keys)]).exit_code == 0


# -- the publisher's keys: checked before anything is copied or written (audit findings 3, 11, 16) ----------


def repository_files(repo_dir: Path) -> dict[str, bytes]:
    """Every file under a repository's metadata/ and targets/ with its bytes: what a refused command must
    leave as it was."""
    return {
        str(path.relative_to(repo_dir)): path.read_bytes()
        for part in ("metadata", "targets")
        for path in sorted((repo_dir / part).rglob("*"))
        if path.is_file()
    }


def assert_one_line_refusal(result: Any, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_signing_with_another_repositorys_keys_is_refused_and_changes_nothing(
    tmp_path: Path, repo: tuple[Path, Path, str]
) -> None:
    """Once: `repo add`/`refresh` with another key set exit 0, signed with keys root does not trust, and every
    device refused the repository from then on (timestamp signed by 0/1 keys)."""
    from localpers.bundle.repository import add_file_target

    repo_dir, _, fingerprint = repo
    other = tmp_path / "other-keys"
    generate_keys(other)
    bundle = make_bundle(tmp_path / "newer", seed="newer")
    before = repository_files(repo_dir)
    untrusted = r"--keys .*other-keys: the targets key [0-9a-f]{12} is not one this repository's root trusts"
    with pytest.raises(InputError, match=untrusted):
        add_bundle(repo_dir, bundle, other)
    with pytest.raises(InputError, match=untrusted):
        add_file_target(repo_dir, "backbone/extra.gguf", bundle / MANIFEST_NAME, other)
    with pytest.raises(InputError, match="the root key .* is not one this repository's root trusts"):
        rotate_keys(repo_dir, other, other)
    added = runner.invoke(app, ["repo", "add", str(repo_dir), str(bundle), "--keys", str(other)])
    assert_one_line_refusal(added, "the targets key", "give this repository's keys directory")
    refreshed = runner.invoke(app, ["repo", "refresh", str(repo_dir), "--keys", str(other)])
    assert_one_line_refusal(refreshed, "the timestamp key", "give this repository's keys directory")
    everything = runner.invoke(app, ["repo", "refresh", str(repo_dir), "--keys", str(other), "--all"])
    assert_one_line_refusal(everything, "the targets key")
    assert repository_files(repo_dir) == before
    pull(repo_dir, trust=fingerprint)  # devices still accept it


def test_a_missing_key_is_refused_before_any_file_is_copied(
    tmp_path: Path, repo: tuple[Path, Path, str]
) -> None:
    """Once: `repo add` copied the bundle into targets/ (and signed targets) before it found no snapshot key."""
    repo_dir, keys, _ = repo
    partial = tmp_path / "partial-keys"
    shutil.copytree(keys, partial)
    (partial / "snapshot.key").unlink()
    before = repository_files(repo_dir)
    with pytest.raises(LocalpersError, match="snapshot.key: no snapshot key there"):
        add_bundle(repo_dir, make_bundle(tmp_path / "newer", seed="newer"), partial)
    assert repository_files(repo_dir) == before


def test_a_keys_directory_inside_the_repository_is_refused(
    tmp_path: Path, repo: tuple[Path, Path, str]
) -> None:
    """Once: `repo init/add --keys REPO/keys` exit 0 and said "upload the repository files", root.key with them."""
    new_repo = tmp_path / "new-repo"
    generate_keys(new_repo / "keys")
    created = runner.invoke(app, ["repo", "init", str(new_repo), "--keys", str(new_repo / "keys")])
    assert_one_line_refusal(
        created, "is inside the repository", "private keys must never be uploaded", "move"
    )
    assert [p.name for p in new_repo.iterdir()] == ["keys"]

    repo_dir, keys, _ = repo
    inside = repo_dir / "keys"
    shutil.copytree(keys, inside)
    linked = tmp_path / "link-to-inside"
    linked.symlink_to(inside)  # resolved: still inside
    bundle = make_bundle(tmp_path / "newer", seed="newer")
    before = repository_files(repo_dir)
    for given in (inside, linked, repo_dir):
        for command in (
            ["repo", "add", str(repo_dir), str(bundle), "--keys", str(given)],
            ["repo", "refresh", str(repo_dir), "--keys", str(given)],
            ["repo", "refresh", str(repo_dir), "--keys", str(given), "--all"],
            ["repo", "add-backbone", str(repo_dir), "--keys", str(given)],
        ):
            assert_one_line_refusal(runner.invoke(app, command), "is inside the repository")
    with pytest.raises(InputError, match="--keys .* is inside the repository"):
        add_bundle(repo_dir, bundle, inside)
    generate_keys(tmp_path / "new-keys")  # `repo keygen` refuses a folder inside the repository itself
    shutil.copytree(tmp_path / "new-keys", repo_dir / "new-keys")
    rotated = runner.invoke(
        app, ["repo", "rotate", str(repo_dir), "--keys", str(keys), "--new-keys", str(repo_dir / "new-keys")]
    )
    assert_one_line_refusal(rotated, "--new-keys", "is inside the repository")
    assert repository_files(repo_dir) == before


def test_serve_gives_only_metadata_and_hash_named_targets_and_follows_a_re_signing(
    tmp_path: Path, repo: tuple[Path, Path, str]
) -> None:
    """Publisher audit (eightieth session): `serve` listed every regular file under targets/ at start, so a keys
    folder put there was served (`GET /targets/keys/root.key` 200), and a `repo add` or `repo refresh` while it ran
    made every pull fail with a 404 that "try again" could not mend, the new timestamp served under the old
    ETag."""
    import hashlib
    import urllib.request

    from localpers.bundle.serve import start_background_server

    repo_dir, keys, fingerprint = repo
    shutil.copytree(keys, repo_dir / "targets" / "keys")  # by hand: every repo command refuses keys there
    (repo_dir / "targets" / "notes.txt").write_text("not signed\n")
    (repo_dir / "metadata" / "timestamp.json.bak").write_text("{}\n")
    server, url = start_background_server(repo_dir)

    def status(path: str) -> int:
        return request(url, "GET", "/" + path)[0]

    try:
        for hidden in ("targets/keys/root.key", "targets/keys/timestamp.key", "targets/notes.txt"):
            assert status(hidden) == 404, hidden
        assert status("metadata/timestamp.json.bak") == 404
        assert status("metadata/1.root.json") == status("metadata/timestamp.json") == 200
        first = pull(url, trust=fingerprint)
        add_bundle(repo_dir, make_bundle(tmp_path / "newer", seed="newer"), keys)  # while serving
        second = pull(url)
        assert second.version != first.version  # type: ignore[attr-defined]
        refresh(repo_dir, keys, expiry_days={"timestamp": 3})
        with urllib.request.urlopen(url + "metadata/timestamp.json") as response:
            served, etag = response.read(), response.headers["ETag"]
        assert served == (repo_dir / "metadata" / "timestamp.json").read_bytes()
        assert etag == f'"{hashlib.sha256(served).hexdigest()}"'
        assert pull(url).unchanged  # type: ignore[attr-defined]
    finally:
        server.close()


def test_serve_stays_up_for_a_missing_path_an_unreadable_target_and_a_replaced_file(
    tmp_path: Path, repo: tuple[Path, Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review of the listing (eightieth session): every request for a missing servable-looking path listed the
    whole folder under the lock every request takes (every pull asks for a next root that is not there); one
    unreadable target made every later listing fail, so every pull; a file hand-placed under a hash-shaped name
    was served; a metadata file replaced under the same size could go out under the old ETag."""
    import os
    import time
    import urllib.request

    from localpers.bundle import served_files
    from localpers.bundle.serve import start_background_server
    from localpers.bundle.served_files import RepositoryFiles

    repo_dir, keys, fingerprint = repo
    sha = "0123456789abcdef" * 4
    (repo_dir / "targets" / f"{sha}.notes.txt").write_text("not the bytes this name promises\n")
    listings: list[int] = []
    real_list = RepositoryFiles._list
    monkeypatch.setattr(RepositoryFiles, "_list", lambda self: listings.append(1) or real_list(self))
    server, url = start_background_server(repo_dir)

    def status(path: str) -> int:
        return request(url, "GET", "/" + path)[0]

    try:
        before = len(listings)
        for _ in range(5):
            assert status("metadata/99.root.json") == 404
            assert status(f"targets/bundle/{sha}.absent.gguf") == 404
            assert status(f"targets/{sha}.notes.txt") == 404  # on disk, refused once as it stands
        # nothing there, or refused as it stands when listed at start: no listing
        assert len(listings) == before
        (repo_dir / "targets" / f"{sha}.a:b").write_text("a name no bundle file may have\n")
        for _ in range(3):
            assert status(f"targets/{sha}.a:b") == 404  # never listed for it (it is no servable name)
            assert status(f"targets/{sha}.x%00y") == 404  # a NUL in the name: answered, not a dropped request
        assert len(listings) == before

        real_hash = served_files.sha256_of_file
        newer = make_bundle(tmp_path / "newer", seed="newer")

        def unreadable(path: Path) -> str:  # as to an account that cannot read what `repo add` wrote
            if path.is_relative_to(repo_dir) and path.name.endswith("head.safetensors"):
                raise PermissionError(13, "Permission denied")
            return real_hash(path)

        monkeypatch.setattr(served_files, "sha256_of_file", unreadable)
        add_bundle(repo_dir, newer, keys)  # new files: listed again
        with pytest.raises(LocalpersError, match="head.safetensors: the repository has no such file"):
            pull(url, trust=fingerprint)  # that file is left out; the server still answers the rest
        assert status("metadata/timestamp.json") == 200
        monkeypatch.setattr(served_files, "sha256_of_file", real_hash)
        time.sleep(0.05)  # past the file system's clock tick since the files were written
        for path in (repo_dir / "targets" / "bundle").glob("*.head.safetensors"):
            path.chmod(0o644)  # made readable again: only its change time moves
        assert pull(url, trust=fingerprint).files == len(FILES)  # type: ignore[attr-defined]

        timestamp = repo_dir / "metadata" / "timestamp.json"
        listed = server.files.get("metadata/timestamp.json")
        assert listed is not None and served_files.file_stamp(timestamp.stat()) == listed.stamp
        before = timestamp.stat()
        refresh(repo_dir, keys, expiry_days={"timestamp": 2})  # a new file renamed into place
        os.utime(
            timestamp, ns=(before.st_atime_ns, before.st_mtime_ns)
        )  # a clock too coarse to tell them apart
        with urllib.request.urlopen(url + "metadata/timestamp.json") as response:
            body, etag = response.read(), response.headers["ETag"]
        assert body == timestamp.read_bytes() and etag == f'"{hashlib.sha256(body).hexdigest()}"'
    finally:
        server.close()


def test_serve_refuses_a_repository_whose_targets_folder_is_a_link(
    tmp_path: Path, repo: tuple[Path, Path, str]
) -> None:
    from localpers.bundle.serve import make_server

    repo_dir, _, _ = repo
    moved = tmp_path / "elsewhere"
    (repo_dir / "targets").rename(moved)
    (repo_dir / "targets").symlink_to(moved)
    with pytest.raises(
        InputError, match="targets is a link; a repository's targets/ is served only as a folder"
    ):
        make_server(repo_dir, port=0)


def test_what_a_repository_serves_is_named_by_its_shape_alone() -> None:
    from localpers.bundle.served_files import servable_in_repository

    sha = "0123456789abcdef" * 4
    for served in (
        "metadata/1.root.json",
        "metadata/12.snapshot.json",
        "metadata/timestamp.json",
        f"targets/bundle/{sha}.manifest.json",
        f"targets/bundle/adapters/{sha}.global.gguf",
        f"targets/backbone/{sha}.{sha}.gguf",
    ):
        assert servable_in_repository(served), served
    for refused in (
        "metadata/0.root.json",
        "metadata/keys/1.root.json",
        "metadata/root.json.bak",
        "targets/keys/root.key",
        f"targets/../metadata/{sha}.x",
        f"targets/.tmp/{sha}.x",
        f"targets/{sha}.x.partial",
        f"targets//{sha}.x",
        f"targets/{sha.upper()}.x",
        f"other/{sha}.x",
        f"targets/{sha[:-1]}.x",
    ):
        assert not servable_in_repository(refused), refused


def test_keygen_inside_a_repository_and_a_key_that_is_not_a_file_are_refused(
    tmp_path: Path, repo: tuple[Path, Path, str]
) -> None:
    """Publisher audit: `repo keygen REPO/targets/keys` exit 0 (and `serve` then gave the keys out); a key file
    linked to /dev/zero read until memory ran out, a FIFO hung; a missing key of a repository's advised making
    new keys, which its root would not trust."""
    import os

    repo_dir, keys, _ = repo
    made = runner.invoke(app, ["repo", "keygen", str(repo_dir / "targets" / "keys")])
    assert_one_line_refusal(made, "is inside the repository", "give a directory outside it")
    assert not (repo_dir / "targets" / "keys").exists()

    odd = tmp_path / "odd-keys"
    shutil.copytree(keys, odd)
    (odd / "timestamp.key").unlink()
    (odd / "timestamp.key").symlink_to("/dev/zero")
    refreshed = runner.invoke(app, ["repo", "refresh", str(repo_dir), "--keys", str(odd)])
    assert_one_line_refusal(refreshed, "timestamp.key is not a regular file")
    (odd / "timestamp.key").unlink()
    os.mkfifo(odd / "timestamp.key")
    refreshed = runner.invoke(app, ["repo", "refresh", str(repo_dir), "--keys", str(odd)])
    assert_one_line_refusal(refreshed, "timestamp.key is not a regular file")

    only_timestamp = tmp_path / "cron-keys"
    only_timestamp.mkdir()
    shutil.copy(keys / "timestamp.key", only_timestamp)
    everything = runner.invoke(
        app, ["repo", "refresh", str(repo_dir), "--keys", str(only_timestamp), "--all"]
    )
    assert everything.exit_code == 1
    assert (
        "no targets key there; give the keys directory this repository was signed with" in everything.stderr
    )
    assert "repo keygen DIR`" not in everything.stderr


def test_keygen_into_a_file_and_keys_that_is_a_file_say_what_to_do(
    tmp_path: Path, repo: tuple[Path, Path, str]
) -> None:
    """Once: `File exists (...)` and `not a PEM private key ([Errno 20] Not a directory: ...)`."""
    afile = tmp_path / "afile"
    afile.write_text("not a directory\n")
    made = runner.invoke(app, ["repo", "keygen", str(afile)])
    assert_one_line_refusal(made, "afile is a file, not a directory; give a new directory for the keys")
    below = runner.invoke(app, ["repo", "keygen", str(afile / "keys")])
    assert_one_line_refusal(below, "a part of this path is a file", "give a new directory")
    assert afile.read_text() == "not a directory\n"
    created = runner.invoke(app, ["repo", "init", str(tmp_path / "new-repo"), "--keys", str(afile)])
    assert_one_line_refusal(created, "--keys", "is a file, not a keys directory", "localpers repo keygen DIR")
    assert not (tmp_path / "new-repo").exists()
    refreshed = runner.invoke(app, ["repo", "refresh", str(repo[0]), "--keys", str(afile)])
    assert_one_line_refusal(refreshed, "is a file, not a keys directory")


# -- the backbone as a signed target --------------------------------------------------------------------


@pytest.fixture
def repo_with_backbone(tmp_path: Path) -> tuple[Path, str, bytes]:
    """A repository whose bundle names a 3 MiB "backbone" published as a signed target."""
    import hashlib

    from localpers.bundle.repository import add_file_target
    from localpers.bundle.repository_metadata import BACKBONE_PREFIX

    backbone = hashlib.shake_256(b"backbone").digest(3 << 20)
    sha = hashlib.sha256(backbone).hexdigest()
    source = tmp_path / "published-backbone.gguf"
    source.write_bytes(backbone)
    repo_dir, keys = tmp_path / "repo", tmp_path / "keys"
    fingerprint = publish(make_bundle(tmp_path / "bundle", backbone_sha256=sha), repo_dir, keys)
    add_file_target(repo_dir, f"{BACKBONE_PREFIX}{sha}.gguf", source, keys)
    return repo_dir, fingerprint, backbone


def test_pull_with_backbone_installs_it_resuming_an_interrupted_download(
    repo_with_backbone: tuple[Path, str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib

    from localpers.bundle.serve import start_background_server
    from localpers.engine import backbone as backbone_module
    from localpers.engine.backbone import pulled_backbone_path, resolve_backbone

    repo_dir, fingerprint, data = repo_with_backbone
    sha = hashlib.sha256(data).hexdigest()
    server, url = start_background_server(repo_dir)
    try:

        def interrupt(relative: str, done: int, total: int) -> None:
            if relative.startswith("backbone/") and done >= 1 << 20:
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            pull_bundle(url, with_backbone=True, trust=fingerprint, on_progress=interrupt)
        partial = pulled_backbone_path(sha).with_name(pulled_backbone_path(sha).name + ".partial")
        assert partial.stat().st_size >= 1 << 20 and nothing_installed()

        seen: list[tuple[str, int, int]] = []
        result = pull_bundle(url, with_backbone=True, on_progress=lambda *a: seen.append(a))
    finally:
        server.close()
    fetched_again = max(done for relative, done, _ in seen if relative.startswith("backbone/"))
    assert fetched_again <= len(data) - (1 << 20)  # resumed, not started over
    assert pulled_backbone_path(sha).read_bytes() == data and not partial.exists()
    assert result.directory.is_dir()  # type: ignore[attr-defined]

    def no_package() -> Path:
        raise LocalpersError("the default backbone package is not installed")

    monkeypatch.setattr(backbone_module, "default_backbone_path", no_package)
    resolved = resolve_backbone()
    assert resolved.source == "pulled" and resolved.sha256 == sha


def test_an_interrupted_add_backbone_leaves_no_partial_copy_in_the_repository(
    tmp_path: Path, repo: tuple[Path, Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Publisher audit: Ctrl-C during `repo add-backbone` said no file was left half-written but kept a 199 MB
    `.partial` in targets/backbone/, which the documented `rsync -a my-repo/ host:` uploads."""
    from localpers.bundle import repository
    from localpers.bundle.repository import add_file_target
    from localpers.bundle.repository_metadata import BACKBONE_PREFIX

    repo_dir, keys, _ = repo
    source = tmp_path / "backbone.gguf"
    source.write_bytes(b"gguf" * 4096)
    sha = hashlib.sha256(source.read_bytes()).hexdigest()

    def cut_short(src: object, dst: Path) -> None:
        Path(dst).write_bytes(b"gguf")  # a part written, then Ctrl-C
        raise KeyboardInterrupt

    before = repository_files(repo_dir)
    monkeypatch.setattr(repository.shutil, "copyfile", cut_short)
    with pytest.raises(KeyboardInterrupt):
        add_file_target(repo_dir, f"{BACKBONE_PREFIX}{sha}.gguf", source, keys)
    assert repository_files(repo_dir) == before


def test_a_stopped_pull_with_the_backbone_says_its_download_is_kept_to_resume(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Publisher audit: Ctrl-C during `pull --with-backbone` said "no file was left half-written" while it kept
    the download's .partial (on purpose: the next pull resumes it)."""
    from localpers.bundle import pull as pull_module

    def stopped(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(pull_module, "pull_bundle", stopped)
    result = runner.invoke(app, ["pull", "http://127.0.0.1:9/", "--with-backbone"])
    assert result.exit_code == 130
    assert "interrupted; the bundle in use is as it was; a backbone download cut short stays" in result.stderr


def test_a_damaged_backbone_download_is_refused_and_started_over(
    repo_with_backbone: tuple[Path, str, bytes],
) -> None:
    import hashlib

    from localpers.engine.backbone import pulled_backbone_path

    repo_dir, fingerprint, data = repo_with_backbone
    sha = hashlib.sha256(data).hexdigest()
    partial = pulled_backbone_path(sha).with_name(pulled_backbone_path(sha).name + ".partial")
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(b"\0" * (1 << 20))  # a partial download that is not the published bytes
    with pytest.raises(InputError, match="signed length or hash"):
        pull_bundle(str(repo_dir), with_backbone=True, trust=fingerprint)
    assert not partial.exists() and not pulled_backbone_path(sha).exists() and nothing_installed()
    pull_bundle(str(repo_dir), with_backbone=True)
    assert pulled_backbone_path(sha).read_bytes() == data


def test_a_pull_without_the_backbone_checks_the_bundle_against_the_backbone_pulled_before(
    repo_with_backbone: tuple[Path, str, bytes],
) -> None:
    # an update pulled without --with-backbone was checked against the default backbone and refused as "built
    # for another backbone", though the device runs this bundle on the backbone it pulled
    repo_dir, fingerprint, _ = repo_with_backbone
    pull_bundle(str(repo_dir), with_backbone=True, trust=fingerprint)
    assert pull_bundle(str(repo_dir)).directory.is_dir()  # type: ignore[attr-defined]
    result = runner.invoke(app, ["pull", str(repo_dir)])
    assert result.exit_code == 0, result.output


def test_a_new_publisher_can_be_confirmed_once(repo: tuple[Path, Path, str]) -> None:
    repo_dir, _, fingerprint = repo
    asked: list[str] = []
    with pytest.raises(LocalpersError, match="does not trust"):
        pull(repo_dir, confirm_trust=lambda fp: asked.append(fp) or False)
    assert asked == [fingerprint] and nothing_installed()
    pull(repo_dir, confirm_trust=lambda fp: asked.append(fp) or True)
    pull(repo_dir, confirm_trust=lambda fp: pytest.fail("asked again"))  # stored: not asked again
    assert asked == [fingerprint, fingerprint]


@pytest.mark.parametrize("argument", ["", "no-such-repo"])
def test_repo_fingerprint_of_a_missing_repository_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argument: str
) -> None:
    """Found by the long hypothesis run: a StorageError traceback for `repo fingerprint ''`."""
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["repo", "fingerprint", argument])
    assert result.exit_code == 1 and (result.exception is None or isinstance(result.exception, SystemExit))
    assert result.stderr.startswith("error: ") and "1.root.json: no such file" in result.stderr


def test_publish_signs_into_a_repository_with_repo_and_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, repo: tuple[Path, Path, str]
) -> None:
    import importlib.util

    if any(
        importlib.util.find_spec(n) is None for n in ("torch", "transformers", "peft", "gguf", "matplotlib")
    ):
        pytest.skip("publish needs the publish extra")
    from localpers.publish import pipeline

    repo_dir, keys, fingerprint = repo
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("{}\n")
    out = tmp_path / "out"

    def fake_publish(options: object, until: object = None, from_stage: object = None) -> dict:
        make_bundle(out, seed="published")  # what the bundle stage writes
        return {"stages": {"bundle": {"files": FILES, "bytes": 1}}, "stage_seconds": {}}

    monkeypatch.setattr(pipeline, "publish", fake_publish)
    refused = runner.invoke(app, ["publish", str(corpus), "--out", str(out), "--repo", str(repo_dir)])
    assert refused.exit_code == 2 and "--repo and --keys go together" in refused.stderr
    assert not out.exists()
    done = runner.invoke(
        app, ["publish", str(corpus), "--out", str(out), "--repo", str(repo_dir), "--keys", str(keys)]
    )
    assert done.exit_code == 0, done.output
    assert "signed into" in done.stdout
    result = pull(repo_dir, trust=fingerprint)
    assert (result.directory / MANIFEST_NAME).read_bytes() == (out / MANIFEST_NAME).read_bytes()  # type: ignore[attr-defined]


def test_a_manifest_signed_as_too_large_is_refused_before_it_is_downloaded(
    repo: tuple[Path, Path, str],
) -> None:
    """python-tuf downloads a target up to its signed length, into memory once read: a "manifest" signed as
    gigabytes (a targets key used by another tool) cost every device that much before the size cap refused it."""
    from tuf.api.metadata import TargetFile

    from localpers.bundle.format import MAX_MANIFEST_BYTES
    from localpers.bundle.keys import load_signers
    from localpers.bundle.repository import publish_targets
    from localpers.bundle.repository_metadata import load_repository, locked_repository

    repo_dir, keys, fingerprint = repo
    length = MAX_MANIFEST_BYTES + 1
    with locked_repository(repo_dir):
        loaded = load_repository(repo_dir)
        signers = load_signers(loaded.directory, loaded.root, keys, ("targets", "snapshot", "timestamp"))
        targets = dict(loaded.targets.signed.targets)
        # signed only: no such file is stored, so any download attempt fails with another message
        targets["bundle/manifest.json"] = TargetFile(length, {"sha256": "0" * 64}, "bundle/manifest.json")
        publish_targets(loaded, targets, signers, None)
    with pytest.raises(LocalpersError) as refused:
        pull(repo_dir, trust=fingerprint)
    message = str(refused.value)
    assert f"targets/bundle/manifest.json: signed as {length} bytes, too large for a manifest" in message
    assert "\n" not in message
    assert nothing_installed()
