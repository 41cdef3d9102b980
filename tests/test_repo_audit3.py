"""A publisher's repository and a device's pull, third audit (eighty-seventh session).

Each test is a case that failed before: a timestamp key of a type TUF cannot sign with ended `repo refresh` in a
traceback; a link at the repository's `.repo.lock` made every repo command create the file it pointed to.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_serve_pull import make_bundle, publish

from localpers.bundle.resigning import refresh
from localpers.errors import InputError, LocalpersError


@pytest.fixture
def published(tmp_path: Path) -> tuple[Path, Path, str]:
    repo_dir, keys = tmp_path / "repo", tmp_path / "keys"
    return repo_dir, keys, publish(make_bundle(tmp_path / "bundle"), repo_dir, keys)


@pytest.mark.parametrize("kind", ["x25519", "ed448"])
def test_a_key_of_a_type_tuf_cannot_sign_with_is_one_line(
    published: tuple[Path, Path, str], kind: str
) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed448, x25519

    repo_dir, keys, _ = published
    key = (x25519.X25519PrivateKey if kind == "x25519" else ed448.Ed448PrivateKey).generate()
    (keys / "timestamp.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    with pytest.raises(InputError, match=r"timestamp.key: a .* key, which cannot sign TUF metadata"):
        refresh(repo_dir, keys)


def test_a_link_at_the_repository_lock_is_refused_not_followed(
    published: tuple[Path, Path, str], tmp_path: Path
) -> None:
    repo_dir, keys, _ = published
    (repo_dir / ".repo.lock").unlink()
    target = tmp_path / "made-by-the-lock"
    (repo_dir / ".repo.lock").symlink_to(target)
    with pytest.raises(LocalpersError, match=r"\.repo\.lock is a link"):
        refresh(repo_dir, keys)
    assert not target.exists()


def _target_files(repo_dir: Path, suffix: str) -> list[Path]:
    return [path for path in (repo_dir / "targets").rglob(f"*{suffix}") if not path.name.startswith(".")]


def test_a_damaged_target_is_copied_again_not_kept(published: tuple[Path, Path, str], tmp_path: Path) -> None:
    # a zero-byte file under a target's hash name (a copy a power cut left empty) was kept by every `repo add`,
    # exit 0, and every device refused the repository
    from test_signed_pull import nothing_installed, pull

    from localpers.bundle.repository import add_bundle

    repo_dir, keys, fingerprint = published
    (head,) = _target_files(repo_dir, ".head.safetensors")
    good = head.read_bytes()
    head.write_bytes(b"")
    add_bundle(repo_dir, tmp_path / "bundle", keys)
    assert head.read_bytes() == good
    pull(repo_dir, trust=fingerprint)
    assert not nothing_installed()


def test_a_file_changed_between_its_check_and_its_copy_is_refused_not_signed(
    published: tuple[Path, Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the bundle was verified, then each file hashed and copied in separate reads: a publish into the same folder
    # meanwhile signed a manifest and targets that disagreed
    import shutil

    from localpers.bundle import repository
    from localpers.bundle.repository import add_bundle
    from localpers.bundle.repository_metadata import load_repository

    repo_dir, keys, _ = published
    version = load_repository(repo_dir).targets.signed.version
    copy = shutil.copyfile

    def changed_meanwhile(source: object, destination: object) -> object:
        if str(source).endswith("head.safetensors"):
            Path(str(source)).write_bytes(Path(str(source)).read_bytes() + b"x")
        return copy(source, destination)

    monkeypatch.setattr(repository.shutil, "copyfile", changed_meanwhile)
    with pytest.raises(InputError, match="head.safetensors: its bytes changed while they were published"):
        add_bundle(repo_dir, tmp_path / "bundle", keys)
    assert load_repository(repo_dir).targets.signed.version == version
    assert not [path for path in (repo_dir / "targets").rglob("*.partial")]


def test_add_backbone_names_the_target_by_the_bytes_it_copies(
    published: tuple[Path, Path, str], tmp_path: Path
) -> None:
    # the name took the hash a stamp remembered for the file's size and mtime: a file changed in place under the
    # same mtime was signed under the old hash, and devices refused the download
    import hashlib
    import os

    from typer.testing import CliRunner

    from localpers.cli import app
    from localpers.engine.backbone import cached_sha256

    repo_dir, keys, _ = published
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(4096))
    stamp = model.stat()
    cached_sha256(model)  # the stamp is written
    model.write_bytes(b"GGUF" + bytes(4095) + b"\x01")
    os.utime(model, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    result = CliRunner().invoke(
        app, ["repo", "add-backbone", str(repo_dir), "--keys", str(keys), "--model", str(model)]
    )
    assert result.exit_code == 0, result.output
    actual = hashlib.sha256(model.read_bytes()).hexdigest()
    (copied,) = (repo_dir / "targets" / "backbone").iterdir()
    assert copied.name == f"{actual}.{actual}.gguf" and actual in result.output


@pytest.mark.parametrize(
    ("url", "target", "refusal"),
    [
        (
            "https://bundles.example.org/metadata/1.root.json",
            "http://bundles.example.org/x",
            "plain http from https",
        ),
        (
            "http://93.184.216.34/metadata/root.json",
            "http://127.0.0.2:8080/router/reboot",
            "on this machine or its",
        ),
        ("http://93.184.216.34/metadata/root.json", "http://192.168.1.1/admin", "on this machine or its"),
        ("http://93.184.216.34/metadata/root.json", "http://[fe80::1]/x", "on this machine or its"),
        (
            "http://93.184.216.34/metadata/root.json",
            "http://169.254.169.254/latest/meta-data",
            "on this machine",
        ),
        ("http://93.184.216.34/x", "ftp://93.184.216.34/x", "not http"),
    ],
)
def test_a_redirect_to_plain_http_or_into_the_local_network_is_refused(
    url: str, target: str, refusal: str
) -> None:
    # only the scheme was checked: a hostile repository could make a device request its router's pages, or read
    # a pull in clear (eighty-seventh session's repository audit)
    from localpers.bundle.transport import check_redirect

    with pytest.raises(LocalpersError, match=refusal):
        check_redirect(url, target)


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("http://bundles.example.org/x", "https://bundles.example.org/x"),  # an upgrade
        ("http://93.184.216.34/x", "https://93.184.216.35/y"),  # a mirror elsewhere on the internet
        ("http://127.0.0.1:8765/x", "http://127.0.0.1:8766/x"),  # a local repository, within this machine
        ("http://192.168.1.10/x", "http://192.168.1.11/x"),  # within the local network it was pulled from
    ],
)
def test_redirects_to_public_mirrors_upgrades_and_within_a_local_network_are_followed(
    url: str, target: str
) -> None:
    from localpers.bundle.transport import check_redirect

    check_redirect(url, target)


def test_a_server_that_trickles_is_given_up_on_not_waited_for() -> None:
    # each read waited up to --timeout, and a byte a second never let one time out: a 1,000-byte file held a pull
    # (and its lock) for 25 minutes, a metadata file for days (eighty-seventh session's repository audit)
    import http.server
    import threading
    import time

    from localpers.bundle.fetcher import Fetcher

    class Trickle(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            for _ in range(40):  # 12 s at most, then the connection closes
                try:
                    self.wfile.write(b"x")
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.3)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    started = time.monotonic()
    try:
        with pytest.raises(LocalpersError, match="slower than 4 KB/s on average; try again"):
            for _ in Fetcher(timeout=1.0).chunks(f"http://127.0.0.1:{server.server_address[1]}/x"):
                pass
    finally:
        server.shutdown()
        server.server_close()
    assert time.monotonic() - started < 5


def test_metadata_changed_behind_the_publisher_is_refused_before_anything_is_signed(
    published: tuple[Path, Path, str], tmp_path: Path
) -> None:
    # the commands re-signed whatever the files said: an edited targets.json pointing at another bundle's files
    # was signed by `repo refresh --all`, and a fresh device installed that bundle (repository audit, s87)
    import json

    from localpers.bundle.repository import add_bundle

    repo_dir, keys, _ = published
    targets = repo_dir / "metadata" / "targets.json"
    original = targets.read_bytes()
    document = json.loads(original)
    entry = next(iter(document["signed"]["targets"].values()))
    entry["hashes"]["sha256"] = "0" * 64
    targets.write_text(json.dumps(document))
    with pytest.raises(InputError, match=r"targets.json: not signed by this repository's targets key"):
        refresh(repo_dir, keys, everything=True)
    with pytest.raises(InputError, match=r"targets.json: not signed"):
        add_bundle(repo_dir, make_bundle(tmp_path / "next", seed="next"), keys)
    targets.write_bytes(original)
    refresh(repo_dir, keys, everything=True)  # as signed, it signs again


def test_a_root_given_another_key_behind_the_publisher_is_refused(published: tuple[Path, Path, str]) -> None:
    # `repo refresh --root` signed a root.json that trusted a second root key, which could then sign roots alone
    import json

    repo_dir, keys, _ = published
    root = repo_dir / "metadata" / "root.json"
    document = json.loads(root.read_text())
    keyid = next(iter(document["signed"]["roles"]["root"]["keyids"]))
    document["signed"]["keys"]["f" * 64] = document["signed"]["keys"][keyid]
    document["signed"]["roles"]["root"]["keyids"].append("f" * 64)
    root.write_text(json.dumps(document))
    with pytest.raises(InputError, match=r"root.json: not the root 1.root.json holds"):
        refresh(repo_dir, keys, root=True)


def test_an_older_signed_targets_file_put_back_is_refused_as_a_rollback(
    published: tuple[Path, Path, str], tmp_path: Path
) -> None:
    from localpers.bundle.repository import add_bundle

    repo_dir, keys, _ = published
    add_bundle(repo_dir, make_bundle(tmp_path / "next", seed="next"), keys)
    metadata = repo_dir / "metadata"
    (metadata / "targets.json").write_bytes((metadata / "1.targets.json").read_bytes())
    with pytest.raises(
        InputError,
        match=r"targets.json: version 1 is older than the version \d the snapshot names \(a rollback\)",
    ):
        refresh(repo_dir, keys, everything=True)


def test_rotated_out_keys_sign_nothing_the_next_command_carries_forward(
    published: tuple[Path, Path, str], tmp_path: Path
) -> None:
    # once a rotation is finished, a targets.json the old (perhaps leaked) keys signed is refused by every command
    # but the ones that finish a rotation (session review: it was trusted after any number of root renewals)
    from test_repo_rotation_record import forge_targets

    from localpers.bundle.keys import generate_keys
    from localpers.bundle.repository import add_bundle
    from localpers.bundle.resigning import rotate_keys

    repo_dir, keys, _ = published
    new_keys = tmp_path / "new-keys"
    generate_keys(new_keys)
    rotate_keys(repo_dir, keys, new_keys)
    refresh(repo_dir, new_keys, root=True)  # a renewal after the finished rotation
    forge_targets(repo_dir, keys)  # signed by the rotated-out targets key
    with pytest.raises(InputError, match=r"targets.json: not signed by this repository's targets key"):
        add_bundle(repo_dir, make_bundle(tmp_path / "next", seed="next"), new_keys)
