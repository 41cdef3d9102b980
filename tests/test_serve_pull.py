"""`localpers serve` and `localpers pull` over 127.0.0.1: what is served, what is refused, and that a
failed or interrupted pull leaves the installed bundle in place with no staging left behind.

Fake bundles are random bytes; the "backbone" is a tiny file whose sha256 the manifest names. Pulls over
HTTP go through a signed repository made with throwaway keys in the test's tmp dir; plain bundle
directories are pulled with `unsigned=True`.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import re
import socket
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from localpers.bundle import pull as pull_module
from localpers.bundle.format import (
    MANIFEST_NAME,
    default_bundle_dir,
    open_bundle,
    verify_bundle,
    write_manifest,
)
from localpers.bundle.keys import generate_keys
from localpers.bundle.locations import CURRENT_FILE, CURRENT_LINK, bundles_root, installed_bundle_dir
from localpers.bundle.pull import pull_bundle
from localpers.bundle.repository import add_bundle, add_file_target, init_repository
from localpers.bundle.serve import BundleServer, parse_range, start_background_server
from localpers.bundle.served_files import ServedFile
from localpers.engine.backbone import Backbone
from localpers.errors import InputError, LocalpersError

FAKE_BACKBONE_BYTES = b"GGUF fake backbone for bundle tests"
BACKBONE_SHA = hashlib.sha256(FAKE_BACKBONE_BYTES).hexdigest()
FILES = {
    "adapters/global.gguf": 70_000,
    "adapters/cluster-0.gguf": 50_000,
    "adapters/cluster-1.gguf": 50_000,
    "centroids.safetensors": 900,
    "head.safetensors": 5_000,
}


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("LOCALPERS_HOME", str(home))
    monkeypatch.delenv("LOCALPERS_MODEL", raising=False)
    return home


def make_bundle(directory: Path, seed: str = "a", backbone_sha256: str = BACKBONE_SHA) -> Path:
    directory.mkdir(parents=True)
    for relative, size in FILES.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(hashlib.shake_256(f"{seed}:{relative}".encode()).digest(size))
    write_manifest(
        directory,
        {
            "backbone": {"name": "fake", "sha256": backbone_sha256},
            "clusters": {"k": 2, "centroids": "centroids.safetensors"},
            "adapters": {n: f"adapters/{n}.gguf" for n in ("global", "cluster-0", "cluster-1")},
            "head": {"file": "head.safetensors"},
        },
    )
    return directory


@pytest.fixture
def bundle_dir(tmp_path: Path) -> Path:
    return make_bundle(tmp_path / "published")


def publish(bundle_dir: Path, repo_dir: Path, keys_dir: Path) -> str:
    """Sign `bundle_dir` into a new repository with new keys; returns the root fingerprint."""
    generate_keys(keys_dir)
    fingerprint = init_repository(repo_dir, keys_dir)
    add_bundle(repo_dir, bundle_dir, keys_dir)
    return fingerprint


@pytest.fixture
def keys_dir(tmp_path: Path) -> Path:
    return tmp_path / "keys"


@pytest.fixture
def repo_dir(tmp_path: Path) -> Path:
    return tmp_path / "repository"


@pytest.fixture
def fingerprint(bundle_dir: Path, repo_dir: Path, keys_dir: Path) -> str:
    return publish(bundle_dir, repo_dir, keys_dir)


@pytest.fixture
def plain_served(bundle_dir: Path) -> Iterator[tuple[BundleServer, str]]:
    """A plain (unsigned) bundle served as in earlier versions: serve still verifies and whitelists it."""
    server, url = start_background_server(bundle_dir)
    try:
        yield server, url
    finally:
        server.close()


@pytest.fixture
def served(repo_dir: Path, fingerprint: str) -> Iterator[tuple[BundleServer, str]]:
    server, url = start_background_server(repo_dir)
    try:
        yield server, url
    finally:
        server.close()


def target_file(repo_dir: Path, relative: str) -> Path:
    """The hash-named file of bundle file `relative` in the repository's targets/."""
    directory, _, name = ("bundle/" + relative).rpartition("/")
    (match,) = (repo_dir / "targets" / directory).glob(f"*.{name}")
    return match


def request(
    url: str, method: str, path: str, headers: dict[str, str] | None = None, body: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    """Send `path` exactly as given (no client-side normalisation) and return status, headers, body."""
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def raw_request(url: str, data: bytes) -> bytes:
    """Send raw bytes (for requests http.client refuses to build) and return the raw response."""
    parsed = urllib.parse.urlsplit(url)
    with socket.create_connection((parsed.hostname, parsed.port), timeout=10) as connection:
        connection.sendall(data)
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def staging_leftovers() -> list[str]:
    return [p.name for p in bundles_root().iterdir() if p.name.startswith((".staging-", ".current-"))]


def installed_versions() -> list[str]:
    """The installed version directories; each has its pull's record beside it, and nothing else is there."""
    versions = bundles_root() / "versions"
    if not versions.exists():
        return []
    names = sorted(p.name for p in versions.iterdir() if p.is_dir())
    assert sorted(p.name for p in versions.iterdir() if not p.is_dir()) == [f"{n}.pulled.json" for n in names]
    return names


# -- serve -------------------------------------------------------------------------------------------


def test_serve_returns_manifest_and_listed_files(
    plain_served: tuple[BundleServer, str], bundle_dir: Path
) -> None:
    _, url = plain_served
    assert url.startswith("http://127.0.0.1:")
    status, headers, body = request(url, "GET", "/manifest.json")
    assert status == 200 and body == (bundle_dir / MANIFEST_NAME).read_bytes()
    assert headers["Content-Type"] == "application/json"
    for relative in FILES:
        status, headers, body = request(url, "GET", "/" + relative)
        assert status == 200 and body == (bundle_dir / relative).read_bytes()
        assert headers["ETag"] == f'"{hashlib.sha256(body).hexdigest()}"'


def test_head_sends_headers_without_body(plain_served: tuple[BundleServer, str]) -> None:
    _, url = plain_served
    status, headers, body = request(url, "HEAD", "/adapters/global.gguf")
    assert status == 200 and body == b""
    assert headers["Content-Length"] == str(FILES["adapters/global.gguf"])
    assert headers["Accept-Ranges"] == "bytes"


def test_unlisted_file_and_directories_are_not_served(
    plain_served: tuple[BundleServer, str], bundle_dir: Path
) -> None:
    _, url = plain_served
    (bundle_dir / "secret.txt").write_text("not in the manifest")
    for path in ("/secret.txt", "/", "/adapters", "/adapters/", "/plots/", "/nothing.gguf"):
        status, _, body = request(url, "GET", path)
        assert status == 404, path
        assert b"not in the manifest" not in body


@pytest.mark.parametrize(
    "path",
    [
        "/../secret.txt",
        "/%2e%2e/secret.txt",
        "/adapters/../secret.txt",
        "/adapters/..%2f..%2fsecret.txt",
        "/adapters%2f..%2fsecret.txt",
        "/%2Fetc%2Fpasswd",
        "//etc/passwd",
        "/adapters/../manifest.json",
        "/./manifest.json",
        "/adapters%5c..%5csecret.txt",
        "/%252e%252e/secret.txt",
        "/%ff%fe",
        "http://127.0.0.1/../secret.txt",
    ],
)
def test_traversal_is_not_served(
    plain_served: tuple[BundleServer, str], bundle_dir: Path, tmp_path: Path, path: str
) -> None:
    _, url = plain_served
    (bundle_dir / "secret.txt").write_text("secret")
    (tmp_path / "secret.txt").write_text("secret")
    status, _, body = request(url, "GET", path)
    assert status == 404 and b"secret" not in body


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "PROPFIND", "TRACE"])
def test_methods_other_than_get_and_head_are_refused(
    plain_served: tuple[BundleServer, str], bundle_dir: Path, method: str
) -> None:
    _, url = plain_served
    before = sorted(p.relative_to(bundle_dir).as_posix() for p in bundle_dir.rglob("*"))
    status, headers, _ = request(url, method, "/uploaded.bin", body=b"payload" * 100)
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    status, _, _ = request(url, method, "/adapters/global.gguf", body=b"overwrite")
    assert status == 405
    assert sorted(p.relative_to(bundle_dir).as_posix() for p in bundle_dir.rglob("*")) == before
    verify_bundle(bundle_dir)


def test_range_requests(plain_served: tuple[BundleServer, str], bundle_dir: Path) -> None:
    _, url = plain_served
    data = (bundle_dir / "head.safetensors").read_bytes()
    size = len(data)
    for header, (start, end) in {
        "bytes=0-9": (0, 9),
        "bytes=100-": (100, size - 1),
        "bytes=-16": (size - 16, size - 1),
        f"bytes=4990-{size + 100}": (4990, size - 1),
    }.items():
        status, headers, body = request(url, "GET", "/head.safetensors", {"Range": header})
        assert status == 206, header
        assert headers["Content-Range"] == f"bytes {start}-{end}/{size}"
        assert body == data[start : end + 1]
    status, _, body = request(url, "GET", "/manifest.json", {"Range": "bytes=0-0"})
    assert status == 206 and body == b"{"


@pytest.mark.parametrize(
    "header", [f"bytes={10**6}-", "bytes=9-2", "bytes=-0", "items=0-3", "bytes=0-1,4-5", "bytes=-"]
)
def test_bad_ranges_get_416(plain_served: tuple[BundleServer, str], header: str) -> None:
    _, url = plain_served
    status, headers, _ = request(url, "GET", "/head.safetensors", {"Range": header})
    assert status == 416
    assert headers["Content-Range"] == f"bytes */{FILES['head.safetensors']}"


def test_parse_range_edges() -> None:
    assert parse_range("bytes=0-0", 1) == (0, 0)
    assert parse_range("bytes=0-", 0) is None
    assert parse_range("bytes=" + "9" * 40 + "-", 10) is None


def test_log_has_method_path_status_only(
    plain_served: tuple[BundleServer, str], caplog: pytest.LogCaptureFixture
) -> None:
    _, url = plain_served
    with caplog.at_level(logging.INFO, logger="localpers.bundle.serve"):
        request(url, "GET", "/head.safetensors")
        request(url, "POST", "/upload", body=b"PRIVATE-BODY-TEXT")
        raw_request(url, b"GET /missing\x1b[31m HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    lines = [record.getMessage() for record in caplog.records if record.name == "localpers.bundle.serve"]
    assert "GET /head.safetensors 200" in lines
    assert "POST /upload 405" in lines
    assert "GET /missing\\x1b[31m 400" in lines  # a control character makes the request line malformed
    assert all("PRIVATE-BODY-TEXT" not in line and "\x1b" not in line for line in lines)


def test_serve_refuses_a_tampered_bundle(bundle_dir: Path) -> None:
    (bundle_dir / "adapters/cluster-1.gguf").write_bytes(b"tampered")
    with pytest.raises(LocalpersError, match="adapters/cluster-1.gguf"):
        start_background_server(bundle_dir)


def test_a_bundle_file_rewritten_after_the_start_is_not_served_even_at_its_size(
    plain_served: tuple[BundleServer, str], bundle_dir: Path
) -> None:
    """`serve` compared only a file's size with the manifest's: other bytes of the same size went out under the
    verified file's ETag (an audit's low finding)."""
    _, url = plain_served
    target = bundle_dir / "adapters/global.gguf"
    original = target.read_bytes()
    target.write_bytes(bytes(len(original)))  # same size, other bytes
    status, _, body = request(url, "GET", "/adapters/global.gguf")
    assert status == 500 and body != bytes(len(original))
    status, _, body = request(url, "GET", "/adapters/cluster-0.gguf")  # the others are served as before
    assert status == 200 and body == (bundle_dir / "adapters/cluster-0.gguf").read_bytes()


# -- pull --------------------------------------------------------------------------------------------


def test_pull_over_loopback_installs_and_becomes_the_default(
    served: tuple[BundleServer, str], bundle_dir: Path, fingerprint: str
) -> None:
    _, url = served
    seen: list[tuple[str, int, int]] = []
    result = pull_bundle(
        url, backbone_sha256=BACKBONE_SHA, on_progress=lambda *a: seen.append(a), trust=fingerprint
    )

    assert result.files == len(FILES) and result.bytes == sum(FILES.values())
    assert result.previous is None
    assert seen[-1][1] == seen[-1][2] == sum(FILES.values())
    assert (bundles_root() / CURRENT_LINK).is_symlink()
    assert installed_bundle_dir() == result.directory.resolve()
    assert default_bundle_dir() == result.directory.resolve()
    bundle = open_bundle(backbone_sha256=BACKBONE_SHA)
    for relative in FILES:
        assert (bundle.directory / relative).read_bytes() == (bundle_dir / relative).read_bytes()
    assert (bundle.directory / MANIFEST_NAME).read_bytes() == (bundle_dir / MANIFEST_NAME).read_bytes()
    assert staging_leftovers() == []


def test_pull_accepts_repository_url_and_directory(
    served: tuple[BundleServer, str], repo_dir: Path, fingerprint: str, keys_dir: Path, tmp_path: Path
) -> None:
    _, url = served
    first = pull_bundle(url, backbone_sha256=BACKBONE_SHA, trust=fingerprint)
    add_bundle(repo_dir, make_bundle(tmp_path / "next", seed="next"), keys_dir)  # a new bundle to pull
    second = pull_bundle(str(repo_dir), backbone_sha256=BACKBONE_SHA)  # trusted since the first pull
    assert second.previous == first.directory.resolve()
    assert installed_bundle_dir() == second.directory.resolve()
    assert installed_versions() == sorted([first.version, second.version])


def test_pulling_the_installed_bundle_again_downloads_nothing_and_keeps_the_previous(
    served: tuple[BundleServer, str], repo_dir: Path, fingerprint: str, keys_dir: Path, tmp_path: Path
) -> None:
    _, url = served
    first = pull_bundle(url, backbone_sha256=BACKBONE_SHA, trust=fingerprint)
    add_bundle(repo_dir, make_bundle(tmp_path / "next", seed="next"), keys_dir)
    source = str(repo_dir)  # the server lists only the files it started with
    second = pull_bundle(source, backbone_sha256=BACKBONE_SHA)
    downloads: list[str] = []
    again = pull_bundle(source, backbone_sha256=BACKBONE_SHA, on_progress=lambda f, d, t: downloads.append(f))
    assert again.unchanged and not second.unchanged
    assert again.directory == installed_bundle_dir() == second.directory.resolve()
    assert downloads == []
    assert installed_versions() == sorted([first.version, second.version])  # the previous one is still there

    # an installed copy that no longer verifies is replaced, not reported up to date
    installed = installed_bundle_dir()
    assert installed is not None
    damaged = installed / "head.safetensors"
    damaged.chmod(0o644)
    damaged.write_bytes(b"x" + damaged.read_bytes()[1:])
    repaired = pull_bundle(source, backbone_sha256=BACKBONE_SHA)
    assert not repaired.unchanged and repaired.previous == installed
    verify_bundle(repaired.directory, backbone_sha256=BACKBONE_SHA)


def test_an_installed_manifest_edited_on_disk_is_refused_until_pulled_again(
    repo_dir: Path, fingerprint: str
) -> None:
    first = pull_bundle(str(repo_dir), backbone_sha256=BACKBONE_SHA, trust=fingerprint)
    assert open_bundle().directory == first.directory.resolve()
    manifest = first.directory / MANIFEST_NAME
    manifest.write_text(manifest.read_text().replace('"name": "fake"', '"name": "edited"'))
    verify_bundle(first.directory)  # every listed file still matches: only the record catches the edit
    refusal = f"the installed bundle's manifest.json ({manifest.resolve()}) changed since it was pulled"
    with pytest.raises(
        InputError, match=re.escape(f"{refusal}; run `localpers pull {repo_dir.resolve()}` again")
    ):
        open_bundle()
    code, out, err = run_cli("bundle", "info")
    assert code == 2 and out == "" and err.count("\n") == 1 and "changed since it was pulled" in err
    # named by its path (`bundles/current`, `versions/<id>`), the pulled version is checked all the same: given
    # to `bundle verify` or `--bundle`, the edit passed (ninetieth session's trust audit)
    for named in (bundles_root() / CURRENT_LINK, first.directory):
        with pytest.raises(InputError, match=re.escape(refusal)):
            open_bundle(named)
        code, out, err = run_cli("bundle", "verify", str(named))
        assert code == 2 and err.count("\n") == 1 and "changed since it was pulled" in err
    second = pull_bundle(str(repo_dir), backbone_sha256=BACKBONE_SHA)
    assert not second.unchanged and open_bundle().manifest["backbone"]["name"] == "fake"


def test_an_unsigned_source_missing_files_is_refused_though_its_manifest_is_installed(
    bundle_dir: Path, tmp_path: Path
) -> None:
    """Publisher audit: `pull COPY --unsigned` of a copy of the installed bundle with 5 of its 8 files deleted
    said "up to date (... its 8 files verified here ...)" with exit 0: a publisher testing a bundle was told all
    was well."""
    import shutil

    installed = pull_bundle(str(bundle_dir), backbone_sha256=BACKBONE_SHA, unsigned=True)
    gutted = tmp_path / "gutted"
    shutil.copytree(bundle_dir, gutted)
    (gutted / "head.safetensors").unlink()
    with pytest.raises(InputError, match="head.safetensors"):
        pull_bundle(str(gutted), backbone_sha256=BACKBONE_SHA, unsigned=True)
    again = pull_bundle(str(bundle_dir), backbone_sha256=BACKBONE_SHA, unsigned=True)
    assert again.unchanged and again.directory == installed.directory


def test_a_version_installed_without_a_record_gets_one_from_the_next_pull(bundle_dir: Path) -> None:
    first = pull_bundle(str(bundle_dir), backbone_sha256=BACKBONE_SHA, unsigned=True)
    record = first.directory.with_name(first.directory.name + ".pulled.json")
    assert json.loads(record.read_text())["signed"] is False
    record.unlink()  # as an older localpers left it
    manifest = first.directory / MANIFEST_NAME
    assert pull_bundle(str(bundle_dir), backbone_sha256=BACKBONE_SHA, unsigned=True).unchanged
    assert record.is_file()
    manifest.write_text(manifest.read_text().replace('"name": "fake"', '"name": "edited"'))
    with pytest.raises(
        InputError, match=re.escape(f"run `localpers pull {bundle_dir.resolve()} --unsigned` again")
    ):
        open_bundle()


def test_old_versions_are_pruned_keeping_the_previous(tmp_path: Path) -> None:
    results = [
        pull_bundle(
            str(make_bundle(tmp_path / f"b{i}", seed=str(i))), backbone_sha256=BACKBONE_SHA, unsigned=True
        )
        for i in range(3)
    ]
    assert installed_versions() == sorted(r.version for r in results[1:])


@pytest.fixture
def installed_previous(tmp_path: Path) -> Path:
    """A bundle already installed by an earlier pull; failing pulls must leave it current."""
    result = pull_bundle(
        str(make_bundle(tmp_path / "previous", seed="old")), backbone_sha256=BACKBONE_SHA, unsigned=True
    )
    return result.directory.resolve()


def assert_previous_intact(previous: Path) -> None:
    assert installed_bundle_dir() == previous
    verify_bundle(previous, backbone_sha256=BACKBONE_SHA)
    assert installed_versions() == [previous.name]
    assert staging_leftovers() == []


def test_pull_of_file_served_with_wrong_content_keeps_previous(
    installed_previous: Path, served: tuple[BundleServer, str], repo_dir: Path, fingerprint: str
) -> None:
    import functools
    import http.server
    import threading

    path = target_file(repo_dir, "adapters/cluster-0.gguf")
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # same size
    path.write_bytes(bytes(data))

    # `localpers serve` no longer gives a target whose bytes are not the sha256 in its name (a 404): a plain
    # static host does, and the device's own check refuses it
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's signature)
            pass

    static = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(repo_dir))
    )
    threading.Thread(target=static.serve_forever, daemon=True).start()
    try:
        with pytest.raises(LocalpersError) as caught:
            pull_bundle(
                f"http://127.0.0.1:{static.server_address[1]}/",
                backbone_sha256=BACKBONE_SHA,
                trust=fingerprint,
            )
    finally:
        static.shutdown()
        static.server_close()
    assert "adapters/cluster-0.gguf" in str(caught.value) and "signed length or hash" in str(caught.value)
    assert_previous_intact(installed_previous)
    _, url = served
    status, _, _ = request(url, "GET", "/" + path.relative_to(repo_dir).as_posix())
    assert status == 404


def test_pull_of_missing_file_keeps_previous(
    installed_previous: Path, served: tuple[BundleServer, str], repo_dir: Path, fingerprint: str
) -> None:
    _, url = served
    target_file(repo_dir, "head.safetensors").unlink()
    with pytest.raises(LocalpersError, match="head.safetensors: the repository has no such file .*HTTP 404"):
        pull_bundle(url, backbone_sha256=BACKBONE_SHA, trust=fingerprint)
    assert_previous_intact(installed_previous)


def test_interrupted_pull_keeps_previous(
    installed_previous: Path, served: tuple[BundleServer, str], fingerprint: str
) -> None:
    _, url = served

    def interrupt(relative: str, done: int, total: int) -> None:
        if done > 60_000:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pull_bundle(url, backbone_sha256=BACKBONE_SHA, on_progress=interrupt, trust=fingerprint)
    assert_previous_intact(installed_previous)


def test_stale_staging_from_a_killed_pull_is_cleaned(installed_previous: Path, bundle_dir: Path) -> None:
    stale = bundles_root() / ".staging-killed"
    (stale / "adapters").mkdir(parents=True)
    (stale / "adapters" / "half.gguf").write_bytes(b"x" * 10)
    pull_bundle(str(bundle_dir), backbone_sha256=BACKBONE_SHA, unsigned=True)
    assert staging_leftovers() == []


def test_pull_refuses_wrong_backbone_before_downloading(
    installed_previous: Path,
    served: tuple[BundleServer, str],
    fingerprint: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, url = served
    with (
        caplog.at_level(logging.INFO, logger="localpers.bundle.serve"),
        pytest.raises(LocalpersError, match="backbone") as caught,
    ):
        pull_bundle(url, backbone_sha256="e" * 64, trust=fingerprint)
    assert BACKBONE_SHA in str(caught.value)
    fetched = [r.getMessage().split()[1] for r in caplog.records if r.name == "localpers.bundle.serve"]
    targets = [path for path in fetched if path.startswith("/targets/")]
    assert len(targets) == 1 and targets[0].endswith(".manifest.json")
    assert_previous_intact(installed_previous)


def sign_edited_manifest(bundle_dir: Path, repo_dir: Path, keys_dir: Path, edit: dict) -> None:
    """The publisher signs an edited (invalid) manifest: a signature does not make a manifest acceptable."""
    manifest = json.loads((bundle_dir / MANIFEST_NAME).read_text())
    manifest.update(edit)
    edited = bundle_dir.parent / "edited-manifest.json"
    edited.write_text(json.dumps(manifest))
    add_file_target(repo_dir, "bundle/manifest.json", edited, keys_dir)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ({"format_version": 2}, "format version 2"),
        ({"files": {"../escape.bin": {"sha256": "0" * 64, "size": 1}}}, "'../escape.bin'"),
        ({"files": {"/etc/passwd": {"sha256": "0" * 64, "size": 1}}}, "'/etc/passwd'"),
        ({"head": {"file": "head-v2.safetensors"}}, "head-v2.safetensors"),
    ],
)
def test_pull_refuses_bad_manifests(
    installed_previous: Path,
    bundle_dir: Path,
    repo_dir: Path,
    keys_dir: Path,
    fingerprint: str,
    edit: dict,
    expected: str,
) -> None:
    sign_edited_manifest(bundle_dir, repo_dir, keys_dir, edit)
    server, url = start_background_server(repo_dir)
    try:
        with pytest.raises(LocalpersError, match=expected):
            pull_bundle(url, backbone_sha256=BACKBONE_SHA, trust=fingerprint)
    finally:
        server.close()
    assert_previous_intact(installed_previous)


def test_pull_refuses_a_manifest_that_disagrees_with_the_signed_targets(
    installed_previous: Path, bundle_dir: Path, repo_dir: Path, keys_dir: Path, fingerprint: str
) -> None:
    manifest = json.loads((bundle_dir / MANIFEST_NAME).read_text())
    manifest["files"]["centroids.safetensors"]["size"] -= 100
    sign_edited_manifest(bundle_dir, repo_dir, keys_dir, {"files": manifest["files"]})
    with pytest.raises(LocalpersError, match="centroids.safetensors: manifest.json lists size"):
        pull_bundle(str(repo_dir), backbone_sha256=BACKBONE_SHA, trust=fingerprint)
    assert_previous_intact(installed_previous)


def test_pull_refuses_extra_bytes(
    installed_previous: Path,
    served: tuple[BundleServer, str],
    repo_dir: Path,
    fingerprint: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, url = served
    path = target_file(repo_dir, "centroids.safetensors")
    longer = path.parent / "longer"
    longer.write_bytes(path.read_bytes() + b"x" * 100)  # the server sends 100 bytes more than signed
    name = path.relative_to(repo_dir).as_posix()
    longer_file = ServedFile(
        size=longer.stat().st_size, sha256="0" * 64, content_type="application/octet-stream", path=longer
    )
    listed = server.files.get
    monkeypatch.setattr(server.files, "get", lambda wanted: longer_file if wanted == name else listed(wanted))
    with pytest.raises(LocalpersError, match="centroids.safetensors.*more than the length signed"):
        pull_bundle(url, backbone_sha256=BACKBONE_SHA, trust=fingerprint)
    assert_previous_intact(installed_previous)


def test_pull_from_unreachable_server_says_so(installed_previous: Path) -> None:
    server, url = start_background_server(installed_previous)
    server.close()  # the port is free again: nothing listens there
    with pytest.raises(LocalpersError, match="could not reach"):
        pull_bundle(url, backbone_sha256=BACKBONE_SHA, timeout=5)
    with pytest.raises(LocalpersError, match="only http"):
        pull_bundle("ftp://example.org/bundle", backbone_sha256=BACKBONE_SHA)
    with pytest.raises(LocalpersError, match="no such directory"):
        pull_bundle("/nonexistent/bundle", backbone_sha256=BACKBONE_SHA)
    assert_previous_intact(installed_previous)


def test_pointer_file_is_used_where_symlinks_fail(
    bundle_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_symlinks(*args: object, **kwargs: object) -> None:
        raise OSError("symlinks not permitted")

    monkeypatch.setattr(pull_module.os, "symlink", no_symlinks)
    first = pull_bundle(str(bundle_dir), backbone_sha256=BACKBONE_SHA, unsigned=True)
    assert not (bundles_root() / CURRENT_LINK).exists()
    assert json.loads((bundles_root() / CURRENT_FILE).read_text()) == {"version": first.version}
    assert installed_bundle_dir() == first.directory
    second = pull_bundle(
        str(make_bundle(tmp_path / "next", seed="n")), backbone_sha256=BACKBONE_SHA, unsigned=True
    )
    assert installed_bundle_dir() == second.directory
    assert second.previous == first.directory


# -- CLI ---------------------------------------------------------------------------------------------


@pytest.fixture
def fake_backbone(tmp_path: Path) -> Path:
    path = tmp_path / "fake-backbone.gguf"
    path.write_bytes(FAKE_BACKBONE_BYTES)
    return path


def run_cli(*args: str) -> tuple[int, str, str]:
    from localpers.cli import app

    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_cli_pull_info_verify(tmp_path: Path, backbone: Backbone) -> None:
    """The CLI pulls a bundle with real content (the fakes above are random bytes, which `pull` now reads
    as a device would and refuses), then shows and verifies it."""
    from synthetic_bundle import make_bundle as make_real_bundle

    real = make_real_bundle(tmp_path / "real", backbone)
    fingerprint = publish(real, tmp_path / "real-repository", tmp_path / "real-keys")
    server, url = start_background_server(tmp_path / "real-repository")
    try:
        code, out, err = run_cli("pull", url, "--model", str(backbone.path), "--trust", fingerprint, "--json")
    finally:
        server.close()
    assert code == 0, err
    pulled = json.loads(out)
    assert pulled["files"] == len(json.loads((real / MANIFEST_NAME).read_text())["files"])

    code, out, _ = run_cli("bundle", "info", "--json")
    assert code == 0
    info = json.loads(out)
    assert info["origin"] == "pulled" and info["k"] == 2 and info["directory"] == pulled["directory"]

    code, out, _ = run_cli("bundle", "verify", "--model", str(backbone.path))
    assert code == 0 and out.startswith("ok: ") and "backbone hash matches" in out


def test_cli_errors_are_one_line_naming_the_file(
    bundle_dir: Path, fake_backbone: Path, tmp_path: Path
) -> None:
    (bundle_dir / "adapters/global.gguf").write_bytes(b"evil")
    code, out, err = run_cli("bundle", "verify", str(bundle_dir), "--model", str(fake_backbone))
    assert code == 2 and out == ""  # bad content from outside: exit code 2
    assert err.startswith("error: ") and err.count("\n") == 1 and "adapters/global.gguf" in err

    other = tmp_path / "other-backbone.gguf"
    other.write_bytes(b"another model")
    code, _, err = run_cli("pull", str(make_bundle(tmp_path / "fresh")), "--model", str(other), "--unsigned")
    assert code == 2 and "backbone" in err and err.count("\n") == 1  # not a bundle for this device
    assert staging_leftovers() == []


def _damage(bundle: Path, how: str) -> None:
    if how == "flipped byte":
        path = bundle / "adapters/global.gguf"
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
    elif how == "truncated":
        (bundle / "head.safetensors").write_bytes((bundle / "head.safetensors").read_bytes()[:100])
    elif how == "deleted":
        (bundle / "centroids.safetensors").unlink()
    elif how == "no manifest":
        (bundle / MANIFEST_NAME).unlink()


@pytest.mark.parametrize("how", ["flipped byte", "truncated", "deleted", "no manifest", "other backbone"])
def test_a_damaged_bundle_directory_exits_2_in_every_command_with_advice_for_a_directory(
    how: str, tmp_path: Path, fake_backbone: Path
) -> None:
    """Found by an audit: `pull DIR --unsigned` exited 1 where `bundle verify DIR` exited 2, a directory without a
    manifest and a backbone mismatch exited 1, and every refusal of a directory the user gave said to pull it again
    with `localpers pull URL`."""
    from localpers.bundle.keys import generate_keys
    from localpers.bundle.repository import init_repository

    bundle = make_bundle(tmp_path / "given")
    _damage(bundle, how)
    model = fake_backbone
    if how == "other backbone":
        model = tmp_path / "other-backbone.gguf"
        model.write_bytes(b"another model")
    generate_keys(tmp_path / "keys")
    init_repository(tmp_path / "repo", tmp_path / "keys")
    assert run_cli("user", "create", "ann")[0] == 0
    commands = {
        "verify": ["bundle", "verify", str(bundle), "--model", str(model)],
        "rewrite": ["rewrite", "--bundle", str(bundle), "--model", str(model), "Some text to rewrite."],
        "pull": ["pull", str(bundle), "--unsigned", "--model", str(model)],
        "repo add": ["repo", "add", str(tmp_path / "repo"), str(bundle), "--keys", str(tmp_path / "keys")],
    }
    if how == "other backbone":
        del commands["repo add"]  # a publisher's machine need not hold the backbone
    for name, args in commands.items():
        code, out, err = run_cli(*args)
        assert code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1, (name, err)
        assert "localpers pull" not in err, (name, err)
        if how == "other backbone":
            assert "backbone" in err, (name, err)
        elif how == "no manifest" and name == "pull":
            assert "give a signed repository's directory (`localpers repo`) or a bundle directory" in err
        elif how == "no manifest":  # most likely another folder: "copy it again" misled (publisher audit)
            assert "give the folder that holds the bundle's manifest.json" in err, (name, err)
            assert "copy the bundle directory again" not in err, (name, err)
        else:
            advice = "before signing it" if name == "repo add" else "copy the bundle directory again"
            assert advice in err, (name, err)
    assert installed_bundle_dir() is None and staging_leftovers() == []


def test_verify_json_prints_its_verdict_on_stdout_when_refused(bundle_dir: Path, fake_backbone: Path) -> None:
    _damage(bundle_dir, "truncated")
    for args in (["verify", "--model", str(fake_backbone)], ["info"]):
        code, out, err = run_cli("bundle", args[0], str(bundle_dir), *args[1:], "--json")
        assert code == 2 and json.loads(out) == {
            "ok": False,
            "error": err.removeprefix("error: ").rstrip("\n"),
        }
        assert "head.safetensors" in err and err.count("\n") == 1
    code, out, err = run_cli("bundle", "verify", str(bundle_dir.parent / "missing"), "--json")
    assert code == 2 and json.loads(out)["ok"] is False and "no such directory" in json.loads(out)["error"]


def test_malformed_arguments_exit_2_saying_what_is_wrong(bundle_dir: Path, fake_backbone: Path) -> None:
    code, _, err = run_cli("serve", str(bundle_dir.parent / "nonexistent"))
    assert code == 2 and "nonexistent: no such directory" in err and "manifest" not in err
    for extra in ([], ["--unsigned"]):
        code, _, err = run_cli(
            "pull", str(bundle_dir), "--trust", "nothex", "--model", str(fake_backbone), *extra
        )
        assert code == 2 and "'nothex' is not a fingerprint: give the 64 hex digits" in err
    code, _, err = run_cli("pull", str(bundle_dir.parent / "nonexistent"), "--model", str(fake_backbone))
    assert code == 2 and "no such directory" in err
    code, _, err = run_cli("pull", "ftp://example.org/bundle", "--model", str(fake_backbone))
    assert code == 2 and "only http://, https:// or a local directory" in err
    code, _, err = run_cli("pull", str(bundle_dir), "--timeout", "inf", "--model", str(fake_backbone))
    assert code == 2 and "--timeout must be a finite number" in err


def test_pull_from_directory_refuses_a_listed_fifo(installed_previous: Path, bundle_dir: Path) -> None:
    import os

    os.mkfifo(bundle_dir / "pipe")
    manifest = json.loads((bundle_dir / MANIFEST_NAME).read_text())
    manifest["files"]["pipe"] = {"sha256": "1" * 64, "size": 0}
    (bundle_dir / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(LocalpersError, match="pipe: is not a regular file"):
        pull_bundle(str(bundle_dir), backbone_sha256=BACKBONE_SHA, unsigned=True)
    assert_previous_intact(installed_previous)


def test_bundle_info_prints_the_manifests_strings_escaped(bundle_dir: Path) -> None:
    manifest = bundle_dir / MANIFEST_NAME
    data = json.loads(manifest.read_text())
    data["created"] = (
        "\x1b]0;retitled\x07\x1b[2J2025"  # an unsigned directory's manifest, shown before any pull
    )
    data["data_card"] = {"source": "\x1b]0;retitled\x07src", "licence": "\x9b2J"}
    manifest.write_text(json.dumps(data))
    code, out, _ = run_cli("bundle", "info", str(bundle_dir))
    assert code == 0 and "\x1b" not in out and "\x9b" not in out and "\\x1b]0;retitled\\x07" in out


def test_the_bundle_servers_log_times_are_utc_and_say_so(tmp_path: Path) -> None:
    """They were the local time with no zone, where every other time localpers prints is UTC."""
    import os
    import queue
    import re
    import subprocess
    import sys
    import threading
    import time
    import urllib.request
    from datetime import UTC, datetime

    from localpers.bundle.locations import embedded_bundle_dir

    env = {**os.environ, "LOCALPERS_HOME": str(tmp_path / "home"), "TZ": "Asia/Kolkata"}  # UTC+05:30
    if not hasattr(time, "tzset"):
        pytest.skip("no TZ support")
    serving = subprocess.Popen(
        [sys.executable, "-m", "localpers.cli", "serve", str(embedded_bundle_dir()), "--port", "0"],
        env=env,
        text=True,
        stderr=subprocess.PIPE,
    )

    lines: queue.Queue[str] = queue.Queue()
    # read in a thread: two lines arriving in one chunk sit in the pipe's buffer, where select() does not see them
    threading.Thread(target=lambda: [lines.put(line) for line in serving.stderr or ()], daemon=True).start()

    def next_line(timeout: float = 60) -> str:
        """The server's next line of stderr; fails rather than hang when none comes."""
        try:
            return lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("the server printed nothing") from None

    try:
        started = next_line()
        url = re.search(r"at (http://\S+)", started)
        assert url, started
        # a plain bundle: what `pull` takes over HTTP is said (publisher audit: it says only "not a signed
        # repository", and --unsigned "applies only to a local bundle directory")
        assert "`localpers pull` over HTTP takes only a signed repository" in next_line()
        urllib.request.urlopen(url.group(1).rstrip("/") + "/manifest.json", timeout=30).read()
        logged = next_line()
    finally:
        serving.terminate()
        serving.communicate(timeout=60)
    stamp = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)Z ", logged)
    assert stamp, logged
    shown = datetime.strptime(stamp.group(1), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    assert abs((datetime.now(UTC) - shown).total_seconds()) < 120


def test_an_unsigned_folder_pulled_without_the_flag_is_a_usage_error(tmp_path: Path) -> None:
    """A flag the argument needs is a usage error (exit 2), as --unsigned given for a repository is; it was 1."""
    code, _, err = run_cli("pull", str(make_bundle(tmp_path / "plain")))
    assert code == 2 and "an unsigned bundle directory" in err and "--unsigned" in err


def test_the_serve_commands_defaults_are_the_servers() -> None:
    """The CLI spells its defaults out (it imports the server only when it serves): they must not drift apart."""
    import inspect

    from localpers.bundle import serve as serve_module
    from localpers.cli.bundle import serve as serve_command

    defaults = {
        name: parameter.default for name, parameter in inspect.signature(serve_command).parameters.items()
    }
    assert (defaults["host"], defaults["port"]) == (serve_module.DEFAULT_HOST, serve_module.DEFAULT_PORT)
