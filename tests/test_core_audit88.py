"""Shared utilities, eighty-eighth session's audit: each test is a case that failed before.

A legal file name of 230-255 bytes could not be written atomically (its temp name was over the file system's 255),
with advice to free disk space; a missing folder got the same advice; `cut_text` with a limit under its mark's
length returned the whole text and more.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localpers.atomic import TEMP_SUFFIX, atomic_write_bytes, remove_stale_temp_files
from localpers.errors import StorageError
from localpers.tasks import CUT_MARK, cut_text


def test_a_long_legal_name_is_written_atomically_and_its_stale_temp_files_swept(tmp_path: Path) -> None:
    target = tmp_path / ("é" * 120 + ".zip")  # 244 bytes: legal, its temp name was not
    atomic_write_bytes(target, b"archive")
    assert target.read_bytes() == b"archive"
    assert [p.name for p in tmp_path.iterdir()] == [target.name]
    # a temp file a killed writer left is recognised as this target's
    dead = 2**22 + 12345  # beyond pid_max's default: no such process
    stem = os.fsdecode(os.fsencode(target.name)[:200].decode("utf-8", "ignore").encode())
    leftover = tmp_path / f".{stem}.{dead}.abcd1234{TEMP_SUFFIX}"
    leftover.write_bytes(b"")
    assert remove_stale_temp_files(target) == [leftover]


def test_the_advice_for_a_write_that_fails_fits_its_cause(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match=r"create its folder or choose another"):
        atomic_write_bytes(tmp_path / "missing" / "x.txt", b"x")


@pytest.mark.parametrize("limit", [-1, 0, 1, len(CUT_MARK) - 1])
def test_a_cut_to_less_than_its_mark_is_no_longer_than_the_limit(limit: int) -> None:
    assert len(cut_text("word " * 300, limit)) <= max(limit, 0)


def test_a_cut_keeps_its_mark_when_there_is_room() -> None:
    cut = cut_text("word " * 300, len(CUT_MARK) + 10)
    assert cut.endswith(CUT_MARK) and len(cut) <= len(CUT_MARK) + 10
