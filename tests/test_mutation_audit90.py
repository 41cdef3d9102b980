"""Gaps found by the ninetieth session's mutation audit of the user archive's reader, the bundle manifest's rules,
the reader of regular files and the parsing of outside JSON: each test fails under a mutation of
`localpers/users/archive.py`, `localpers/bundle/manifest.py`, `localpers/regular_files.py` or
`localpers/untrusted.py` that the test files covering them let through.

Nothing here loads a model: archives are built in memory and read with `read_archive`.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
from test_hardening import archive_bytes  # the zip of members, as the F4 tests build theirs

from localpers.errors import InputError
from localpers.users.archive import (
    MAX_ARCHIVE_MEMBER_BYTES,
    MAX_ARCHIVE_TOTAL_BYTES,
    pack_archive,
    read_archive,
)

VECTOR_A = "vector-00000000000000aa.safetensors"
VECTOR_B = "vector-00000000000000bb.safetensors"


def manifest_of(members: dict[str, bytes]) -> bytes:
    """The manifest.json `localpers user export` writes for `members`."""
    with zipfile.ZipFile(io.BytesIO(pack_archive("ann", 0, members))) as archive:
        return archive.read("manifest.json")


def test_one_member_over_its_cap_is_refused_though_the_total_is_under_its_own(tmp_path: Path) -> None:
    big = b"\0" * (MAX_ARCHIVE_MEMBER_BYTES + 1)
    assert len(big) < MAX_ARCHIVE_TOTAL_BYTES  # only the per-member cap can refuse it
    path = tmp_path / "big.zip"
    path.write_bytes(archive_bytes({"manifest.json": b"{}", "history.jsonl": big}))
    with pytest.raises(InputError, match="history.jsonl is too large for a user archive"):
        read_archive(path)


def test_two_vectors_are_refused(tmp_path: Path) -> None:
    members = {"state.json": b"{}", VECTOR_A: b"a", VECTOR_B: b"b"}
    path = tmp_path / "two.zip"
    path.write_bytes(archive_bytes({"manifest.json": manifest_of(members), **members}))
    with pytest.raises(InputError, match="more than one vector file"):
        read_archive(path)


def test_a_member_the_manifest_does_not_list_is_refused(tmp_path: Path) -> None:
    listed = {"state.json": b"{}"}
    path = tmp_path / "unlisted.zip"
    # history.jsonl would go unchecked by any sha256
    path.write_bytes(
        archive_bytes({"manifest.json": manifest_of(listed), **listed, "history.jsonl": b"{}\n"})
    )
    with pytest.raises(InputError, match="field 'files' does not list the archive's files"):
        read_archive(path)
    path.write_bytes(archive_bytes({"manifest.json": manifest_of(listed), **listed}))
    manifest, members = read_archive(path)  # the same archive without the extra member is read
    assert members == listed and manifest["name"] == "ann"


SHA = "ab" * 32


def manifest(files: dict[str, dict] | None = None, **fields: object) -> dict:
    """The smallest manifest validate_manifest passes, with `fields` changed."""
    return {
        "format": "localpers-bundle",
        "format_version": 1,
        "backbone": {"name": "b", "sha256": SHA},
        "files": {"head.safetensors": {"sha256": SHA, "size": 1}} if files is None else files,
        **fields,
    }


def test_the_smallest_manifest_passes() -> None:
    from localpers.bundle.manifest import validate_manifest

    validate_manifest(manifest())  # the cases below fail for their one change only


def test_a_manifest_listing_itself_is_refused() -> None:
    from localpers.bundle.manifest import BundleProblem, validate_manifest

    with pytest.raises(BundleProblem, match="manifest.json cannot list itself"):
        validate_manifest(manifest({"manifest.json": {"sha256": SHA, "size": 1}}))


def test_a_backbone_hash_that_is_not_lowercase_hex_is_refused() -> None:
    from localpers.bundle.manifest import BundleProblem, validate_manifest

    for bad in ("AB" * 32, "ab" * 31, "zz" * 32):
        with pytest.raises(BundleProblem, match="backbone.sha256"):
            validate_manifest(manifest(backbone={"name": "b", "sha256": bad}))


def test_a_manifest_listing_more_files_than_a_bundle_may_have_is_refused() -> None:
    from localpers.bundle.manifest import MAX_BUNDLE_FILES, BundleProblem, validate_manifest

    files = {f"f{i}": {"sha256": SHA, "size": 0} for i in range(MAX_BUNDLE_FILES + 1)}
    with pytest.raises(BundleProblem, match=f"lists {MAX_BUNDLE_FILES + 1} files"):
        validate_manifest(manifest(files))
    files.popitem()
    validate_manifest(manifest(files))  # the bound itself passes


def test_manifest_bytes_over_the_cap_are_refused_before_they_are_parsed(monkeypatch) -> None:
    from localpers.bundle import manifest as manifest_module

    monkeypatch.setattr(manifest_module, "MAX_MANIFEST_BYTES", 100)
    small = b'{"a": 1}'
    assert manifest_module.parse_manifest(small, "m") == {"a": 1}
    with pytest.raises(manifest_module.BundleProblem, match="101 bytes is too large for a manifest"):
        manifest_module.parse_manifest(b"{" + b" " * 99 + b"}", "m")


# -- localpers/regular_files.py: what is read, and what is refused unopened --------------------------------


def test_a_link_is_refused_where_links_are_not_followed(tmp_path: Path) -> None:
    from localpers.regular_files import read_regular_file

    (tmp_path / "real").write_bytes(b"data")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert read_regular_file(tmp_path / "link", 100, what="cache") == b"data"
    with pytest.raises(InputError, match="link is a link; pass a cache"):
        read_regular_file(tmp_path / "link", 100, what="cache", follow_links=False)


def test_a_folder_a_fifo_and_an_oversized_file_are_refused_unopened(tmp_path: Path) -> None:
    import os

    from localpers.regular_files import read_regular_file

    with pytest.raises(InputError, match="is a directory"):
        read_regular_file(tmp_path, 100, what="cache")
    os.mkfifo(tmp_path / "fifo")  # opening it for reading would wait for a writer
    with pytest.raises(InputError, match=r"is not a regular file \(a FIFO, device or socket\)"):
        read_regular_file(tmp_path / "fifo", 100, what="cache")
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(InputError, match="is 101 bytes, more than the 100 a cache may have"):
        read_regular_file(tmp_path / "big", 100, what="cache")


def test_what_changes_between_the_check_and_the_read_is_refused_too(monkeypatch, tmp_path: Path) -> None:
    """A FIFO, or a file grown past the limit, swapped in after the stat check: the open must not block and the
    read is capped."""
    import os
    import signal

    from localpers.regular_files import read_regular_file

    (tmp_path / "small").write_bytes(b"x")
    as_checked = (tmp_path / "small").stat()
    real_stat = Path.stat
    monkeypatch.setattr(
        Path, "stat", lambda self, **kw: as_checked if self.parent == tmp_path else real_stat(self, **kw)
    )
    os.mkfifo(tmp_path / "fifo")

    def hung(*args: object) -> None:
        raise TimeoutError("the open of a FIFO blocked")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(5)
    try:
        with pytest.raises(InputError, match="fifo is not a regular file; pass a cache"):
            read_regular_file(tmp_path / "fifo", 100, what="cache")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    (tmp_path / "grown").write_bytes(b"x" * 101)
    with pytest.raises(InputError, match="grown is more than the 100 bytes a cache may have"):
        read_regular_file(tmp_path / "grown", 100, what="cache")


# -- localpers/untrusted.py: outside JSON and one-line text ----------------------------------------------------


def test_json_nested_past_the_limit_is_refused_and_at_the_limit_read() -> None:
    from localpers.untrusted import MAX_JSON_DEPTH, JSONProblem, parse_json

    at_limit = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert parse_json(at_limit) == parse_json(at_limit)  # read, not refused
    past = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)  # far from Python's recursion limit
    with pytest.raises(JSONProblem, match=f"nested deeper than {MAX_JSON_DEPTH} levels"):
        parse_json(past)
    with pytest.raises(JSONProblem, match="nested deeper than 3 levels"):
        parse_json('{"a": {"b": [1]}, "c": {"d": {"e": {}}}}', max_depth=3)


def test_a_number_of_more_digits_than_python_reads_is_named() -> None:
    from localpers.untrusted import JSONProblem, parse_json

    with pytest.raises(JSONProblem, match="a number has more digits than the 4300 Python accepts"):
        parse_json("9" * 5000)


def test_one_line_cuts_at_its_limit() -> None:
    from localpers.untrusted import one_line

    assert one_line("abcdef", limit=3) == "abc..."
    assert one_line("abc", limit=3) == "abc"
    assert one_line("a\nb") == "a\\nb"


def test_the_first_string_that_is_not_unicode_text_is_named() -> None:
    from localpers.untrusted import unencodable_field

    assert (
        unencodable_field({"messages": [{"content": "ok"}, {"content": "\ud800"}]}) == "messages[1].content"
    )
    assert unencodable_field({"\udc80": 1}) == "the body (a key)"
    assert unencodable_field("\ud800") == "the body"
    assert unencodable_field({"messages": [{"content": "ok"}]}) is None


def test_an_oversized_manifest_in_a_given_folder_gets_the_advice_for_its_source(
    monkeypatch, tmp_path: Path
) -> None:
    """Read as a stored file, a manifest over the cap was a plain InputError that `advising` passed by (the
    session's review): the message ended without saying what to do about a bundle from there."""
    from localpers.bundle import format as bundle_format
    from localpers.bundle.format import GIVEN_BUNDLE_ADVICE, open_bundle

    monkeypatch.setattr(bundle_format, "MAX_MANIFEST_BYTES", 10)
    (tmp_path / "manifest.json").write_text('{"format": "localpers-bundle"}')
    with pytest.raises(InputError, match=f"this is not a bundle; {GIVEN_BUNDLE_ADVICE}"):
        open_bundle(tmp_path)
