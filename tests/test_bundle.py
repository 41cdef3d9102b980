"""Bundle manifests: write/verify round trip and every tamper case refused with the file named.

Fake bundles are random bytes in tmp dirs; no model is needed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from localpers.bundle import format as bundle_module
from localpers.bundle.format import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    default_bundle_dir,
    open_bundle,
    verify_bundle,
    write_manifest,
)
from localpers.bundle.locations import embedded_bundle_dir
from localpers.errors import InputError, LocalpersError

BACKBONE_SHA = hashlib.sha256(b"fake backbone").hexdigest()
FILE_SIZES = {
    "adapters/global.gguf": 3000,
    "adapters/cluster-0.gguf": 2500,
    "adapters/cluster-1.gguf": 2500,
    "centroids.safetensors": 700,
    "head.safetensors": 1800,
    "plots/loss.png": 0,
}


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("LOCALPERS_HOME", str(home))
    return home


def make_fake_bundle(directory: Path, backbone_sha256: str = BACKBONE_SHA, seed: int = 0) -> Path:
    """A bundle of random bytes laid out like a published one, with its manifest written."""
    directory.mkdir(parents=True)
    for index, (relative, size) in enumerate(FILE_SIZES.items()):
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(hashlib.shake_256(f"{seed}-{index}".encode()).digest(size) if size else b"")
    manifest = {
        "created": "2026-01-01T00:00:00Z",
        "backbone": {"name": "fake", "sha256": backbone_sha256, "n_embd": 640, "n_layer": 18},
        "encoder": {"id": "fake-encoder", "dim": 384},
        "task": "headline",
        "clusters": {"k": 2, "centroids": "centroids.safetensors", "sizes": [3, 4]},
        "adapters": {
            "global": "adapters/global.gguf",
            "cluster-0": "adapters/cluster-0.gguf",
            "cluster-1": "adapters/cluster-1.gguf",
        },
        "head": {"file": "head.safetensors", "d": 8},
    }
    write_manifest(directory, manifest)
    return directory


def load_manifest(directory: Path) -> dict:
    return json.loads((directory / MANIFEST_NAME).read_text())


def save_manifest(directory: Path, manifest: dict) -> None:
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest))


def refusal(directory: Path, **kwargs: object) -> str:
    with pytest.raises(LocalpersError) as caught:
        verify_bundle(directory, **kwargs)  # type: ignore[arg-type]
    return str(caught.value)


@pytest.fixture
def fake_bundle(tmp_path: Path) -> Path:
    return make_fake_bundle(tmp_path / "bundle")


# -- round trip --------------------------------------------------------------------------------------


def test_write_manifest_lists_every_file_with_hash_and_size(tmp_path: Path) -> None:
    directory = tmp_path / "b"
    directory.mkdir()
    (directory / "z.bin").write_bytes(b"zz")
    (directory / "sub").mkdir()
    (directory / "sub" / "a.bin").write_bytes(b"hello")
    (directory / "half.gguf.partial").write_bytes(b"unfinished")
    manifest = {"backbone": {"sha256": BACKBONE_SHA}}
    path = write_manifest(directory, manifest)

    written = json.loads(path.read_text())
    assert list(written["files"]) == ["sub/a.bin", "z.bin"]
    assert written["files"]["sub/a.bin"] == {"sha256": hashlib.sha256(b"hello").hexdigest(), "size": 5}
    assert written["format"] == FORMAT and written["format_version"] == FORMAT_VERSION
    assert manifest["files"] == written["files"]  # filled in place too
    assert sorted(p.name for p in directory.iterdir()) == [
        "half.gguf.partial",
        "manifest.json",
        "sub",
        "z.bin",
    ]


def test_write_manifest_twice_does_not_list_the_manifest(fake_bundle: Path) -> None:
    manifest = load_manifest(fake_bundle)
    write_manifest(fake_bundle, manifest)
    assert MANIFEST_NAME not in load_manifest(fake_bundle)["files"]
    verify_bundle(fake_bundle)


def test_a_written_manifest_is_readable_like_the_bundles_other_files(fake_bundle: Path) -> None:
    """The atomic write left manifest.json 0600: another account could read every bundle file but the one that
    makes it a bundle (audit85)."""
    mask = os.umask(0o022)  # the mode follows the umask (0o666 & ~umask); the CI image's own is not known
    try:
        write_manifest(fake_bundle, load_manifest(fake_bundle))
    finally:
        os.umask(mask)
    assert (fake_bundle / MANIFEST_NAME).stat().st_mode & 0o777 == 0o644


def test_round_trip_and_accessors(fake_bundle: Path) -> None:
    bundle = verify_bundle(fake_bundle, backbone_sha256=BACKBONE_SHA)
    assert bundle.directory == fake_bundle
    assert bundle.k == 2
    assert bundle.backbone_sha256 == BACKBONE_SHA
    assert bundle.adapter_names == ["global", "cluster-0", "cluster-1"]
    assert bundle.adapter_path("global") == fake_bundle / "adapters/global.gguf"
    assert bundle.cluster_adapter_name(1) == "cluster-1"
    assert (
        bundle.adapter_path(bundle.cluster_adapter_name(0)).read_bytes()[:4]
        == ((fake_bundle / "adapters/cluster-0.gguf").read_bytes()[:4])
    )
    assert bundle.head_path == fake_bundle / "head.safetensors"
    assert bundle.centroids_path == fake_bundle / "centroids.safetensors"
    assert bundle.total_size == sum(FILE_SIZES.values())
    with pytest.raises(LocalpersError, match="no adapter 'cluster-7'"):
        bundle.adapter_path("cluster-7")
    with pytest.raises(LocalpersError, match="out of range"):
        bundle.cluster_adapter_name(2)


def test_missing_optional_sections_fail_only_when_asked_for(fake_bundle: Path) -> None:
    manifest = load_manifest(fake_bundle)
    del manifest["head"]
    save_manifest(fake_bundle, manifest)
    bundle = verify_bundle(fake_bundle)
    with pytest.raises(LocalpersError, match="head.file"):
        _ = bundle.head_path


# -- tamper cases ------------------------------------------------------------------------------------


def test_flipped_byte_in_adapter_is_refused(fake_bundle: Path) -> None:
    path = fake_bundle / "adapters/cluster-0.gguf"
    data = bytearray(path.read_bytes())
    data[1234] ^= 0x01
    path.write_bytes(bytes(data))
    message = refusal(fake_bundle)
    assert "adapters/cluster-0.gguf" in message and "sha256" in message


def test_swapped_files_same_size_are_refused(fake_bundle: Path) -> None:
    first, second = fake_bundle / "adapters/cluster-0.gguf", fake_bundle / "adapters/cluster-1.gguf"
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)
    second.write_bytes(a)
    message = refusal(fake_bundle)
    assert "adapters/cluster-0.gguf" in message and "sha256" in message


def test_swapped_files_different_size_are_refused(fake_bundle: Path) -> None:
    first, second = fake_bundle / "adapters/global.gguf", fake_bundle / "head.safetensors"
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)
    second.write_bytes(a)
    message = refusal(fake_bundle)
    assert "adapters/global.gguf" in message and "size" in message


def test_missing_file_is_refused(fake_bundle: Path) -> None:
    (fake_bundle / "head.safetensors").unlink()
    message = refusal(fake_bundle)
    assert "head.safetensors" in message and "missing" in message


def test_manifest_with_edited_size_is_refused(fake_bundle: Path) -> None:
    manifest = load_manifest(fake_bundle)
    manifest["files"]["centroids.safetensors"]["size"] += 1
    save_manifest(fake_bundle, manifest)
    message = refusal(fake_bundle)
    assert "centroids.safetensors" in message and "size" in message


def test_manifest_with_edited_hash_is_refused(fake_bundle: Path) -> None:
    manifest = load_manifest(fake_bundle)
    manifest["files"]["adapters/global.gguf"]["sha256"] = "0" * 64
    save_manifest(fake_bundle, manifest)
    assert "adapters/global.gguf" in refusal(fake_bundle)


def test_manifest_listing_a_file_that_is_not_there_is_refused(fake_bundle: Path) -> None:
    manifest = load_manifest(fake_bundle)
    manifest["files"]["adapters/cluster-9.gguf"] = {"sha256": "1" * 64, "size": 10}
    save_manifest(fake_bundle, manifest)
    message = refusal(fake_bundle)
    assert "adapters/cluster-9.gguf" in message and "missing" in message


def test_reference_to_unlisted_file_is_refused(fake_bundle: Path) -> None:
    manifest = load_manifest(fake_bundle)
    manifest["adapters"]["cluster-2"] = "adapters/cluster-2.gguf"
    save_manifest(fake_bundle, manifest)
    message = refusal(fake_bundle)
    assert "adapters.cluster-2" in message and "adapters/cluster-2.gguf" in message


@pytest.mark.parametrize(
    "bad_path",
    ["../x", "/etc/passwd", "a/../../x", "adapters\\..\\x", "./head.safetensors", "a//b", "C:x", ""],
)
def test_unsafe_path_in_files_is_refused(fake_bundle: Path, bad_path: str) -> None:
    manifest = load_manifest(fake_bundle)
    manifest["files"][bad_path] = {"sha256": "1" * 64, "size": 1}
    save_manifest(fake_bundle, manifest)
    message = refusal(fake_bundle)
    assert "refusing file path" in message and repr(bad_path) in message


@pytest.mark.parametrize(
    ("section", "key"), [("head", "file"), ("clusters", "centroids"), ("adapters", "global")]
)
def test_unsafe_path_in_references_is_refused(fake_bundle: Path, section: str, key: str) -> None:
    manifest = load_manifest(fake_bundle)
    manifest[section][key] = "../../etc/passwd"
    save_manifest(fake_bundle, manifest)
    message = refusal(fake_bundle)
    assert f"{section}.{key}" in message and "'../../etc/passwd'" in message


def test_listed_symlink_leading_outside_is_refused(fake_bundle: Path, tmp_path: Path) -> None:
    outside = tmp_path / "secret"
    outside.write_bytes(b"secret!")
    (fake_bundle / "link").symlink_to(outside)
    manifest = load_manifest(fake_bundle)
    manifest["files"]["link"] = {"sha256": hashlib.sha256(b"secret!").hexdigest(), "size": 7}
    save_manifest(fake_bundle, manifest)
    message = refusal(fake_bundle)
    assert "link" in message and "outside the bundle" in message


@pytest.mark.parametrize("version", [2, 0, "1", True, None])
def test_unknown_format_version_is_refused(fake_bundle: Path, version: object) -> None:
    manifest = load_manifest(fake_bundle)
    manifest["format_version"] = version
    save_manifest(fake_bundle, manifest)
    message = refusal(fake_bundle)
    assert "format_version" in message or "format version" in message
    if version == 2:
        assert "upgrade localpers" in message


@pytest.mark.parametrize("section", ["encoder", "data_card", "training", "prompt", "lora"])
@pytest.mark.parametrize("value", ["all-MiniLM-L6-v2", [1, 2], 3])
def test_a_section_that_is_not_an_object_is_refused_by_name(
    fake_bundle: Path, section: str, value: object
) -> None:
    manifest = load_manifest(fake_bundle)
    manifest[section] = value
    save_manifest(fake_bundle, manifest)
    message = refusal(fake_bundle)
    assert f"field '{section}' must be an object" in message and MANIFEST_NAME in message


def test_wrong_format_is_refused(fake_bundle: Path) -> None:
    manifest = load_manifest(fake_bundle)
    manifest["format"] = "something-else"
    save_manifest(fake_bundle, manifest)
    assert "not a localpers bundle" in refusal(fake_bundle)


def test_wrong_backbone_hash_is_refused(fake_bundle: Path) -> None:
    other = hashlib.sha256(b"another backbone").hexdigest()
    message = refusal(fake_bundle, backbone_sha256=other)
    assert BACKBONE_SHA in message and other in message and "backbone" in message
    verify_bundle(fake_bundle, backbone_sha256=BACKBONE_SHA.upper())  # case of the caller's hex is irrelevant


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"format": "localpers-bundle", "format": "x"}', "duplicate key"),
    ],
)
def test_malformed_manifest_is_refused(fake_bundle: Path, text: str, expected: str) -> None:
    (fake_bundle / MANIFEST_NAME).write_text(text)
    message = refusal(fake_bundle)
    assert expected in message and MANIFEST_NAME in message


def test_bad_file_entries_are_refused(fake_bundle: Path) -> None:
    manifest = load_manifest(fake_bundle)
    manifest["files"]["head.safetensors"]["size"] = -1
    save_manifest(fake_bundle, manifest)
    assert "files['head.safetensors'].size" in refusal(fake_bundle)
    manifest["files"]["head.safetensors"] = {"sha256": "XYZ", "size": 1}
    save_manifest(fake_bundle, manifest)
    assert "files['head.safetensors'].sha256" in refusal(fake_bundle)
    manifest = load_manifest(fake_bundle)
    entry = manifest["files"]["adapters/global.gguf"]
    entry["sha256"] += "\n"  # a regex `$` would let a trailing newline through
    save_manifest(fake_bundle, manifest)
    assert "files['adapters/global.gguf'].sha256" in refusal(fake_bundle)


def test_directory_listed_as_file_is_refused(fake_bundle: Path) -> None:
    (fake_bundle / "extra").mkdir()
    manifest = load_manifest(fake_bundle)
    manifest["files"]["extra"] = {"sha256": "1" * 64, "size": 0}
    save_manifest(fake_bundle, manifest)
    assert "extra: is not a regular file" in refusal(fake_bundle)


def test_write_manifest_refuses_unsafe_file_names(tmp_path: Path) -> None:
    directory = tmp_path / "b"
    directory.mkdir()
    (directory / "bad:name").write_bytes(b"x")
    with pytest.raises(LocalpersError, match="bad:name"):
        write_manifest(directory, {"backbone": {"sha256": BACKBONE_SHA}})


# -- default locations -------------------------------------------------------------------------------


def test_open_bundle_without_any_bundle_says_to_pull(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(bundle_module, "embedded_bundle_dir", lambda: tmp_path / "no-demo-bundle")
    assert default_bundle_dir() == tmp_path / "no-demo-bundle"
    with pytest.raises(
        LocalpersError, match="no bundle installed.*`localpers pull URL` with the address of a signed"
    ):
        open_bundle()
    # A directory the user gave: what is wrong with it (exit code 2), never advice to pull.
    with pytest.raises(InputError, match="elsewhere: no such directory") as missing:
        open_bundle(tmp_path / "elsewhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        InputError, match="empty: no manifest.json there, so it is not a bundle directory"
    ) as empty:
        open_bundle(tmp_path / "empty")
    assert "pull" not in str(missing.value) + str(empty.value)


def test_embedded_bundle_dir_is_the_models_package() -> None:
    assert embedded_bundle_dir().name == "demo-bundle"
    assert embedded_bundle_dir().parent.name == "models"


def test_open_bundle_uses_the_given_directory(fake_bundle: Path) -> None:
    bundle = open_bundle(fake_bundle, backbone_sha256=BACKBONE_SHA)
    assert bundle.k == 2
    with pytest.raises(LocalpersError, match="backbone"):
        open_bundle(fake_bundle, backbone_sha256="f" * 64)


def test_verify_reports_files_in_manifest_order(fake_bundle: Path) -> None:
    for relative in ("adapters/global.gguf", "head.safetensors"):
        os.truncate(fake_bundle / relative, 1)
    assert "adapters/global.gguf" in refusal(fake_bundle)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [("head.safetensors/x", "also a directory"), ("Head.safetensors", "only in letter case")],
)
def test_colliding_paths_are_refused(fake_bundle: Path, extra: str, expected: str) -> None:
    manifest = load_manifest(fake_bundle)
    manifest["files"][extra] = {"sha256": "1" * 64, "size": 1}
    save_manifest(fake_bundle, manifest)
    assert expected in refusal(fake_bundle)


def test_directory_without_manifest_is_not_a_bundle(tmp_path: Path) -> None:
    with pytest.raises(LocalpersError, match="no manifest.json there"):
        verify_bundle(tmp_path)


def test_a_folder_without_manifest_is_told_by_where_it_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder given as a bundle without manifest.json is most likely another folder (publisher audit: "copy
    the bundle directory again" for `bundle verify my-repo`); the demo bundle's own folder without it still says
    to reinstall, as any damage to it does."""
    with pytest.raises(
        InputError, match="not a bundle directory; give the folder that holds the bundle's manifest"
    ):
        open_bundle(tmp_path)
    demo = tmp_path / "demo-bundle"
    demo.mkdir()
    monkeypatch.setattr(bundle_module, "embedded_bundle_dir", lambda: demo)
    with pytest.raises(
        InputError, match="no manifest.json there, .*the demo bundle shipped with localpers is"
    ):
        open_bundle(demo)


def test_listed_fifo_is_refused_without_blocking(fake_bundle: Path) -> None:
    os.mkfifo(fake_bundle / "pipe")
    manifest = load_manifest(fake_bundle)
    manifest["files"]["pipe"] = {"sha256": "1" * 64, "size": 0}
    save_manifest(fake_bundle, manifest)
    assert "pipe: is not a regular file" in refusal(fake_bundle)
