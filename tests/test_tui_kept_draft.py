"""The draft a stop signal keeps (`localpers.tui.kept_draft`): written for the next start, never an error."""

from __future__ import annotations

import os
from pathlib import Path

from localpers.tui.kept_draft import DRAFT_FILE, keep_draft, kept_draft_path, take_kept_draft


def test_a_kept_draft_is_taken_once() -> None:
    assert take_kept_draft() == (None, None)
    assert keep_draft("line one\nline two ✓") is None
    assert take_kept_draft() == ("line one\nline two ✓", None)
    assert not kept_draft_path().exists() and take_kept_draft() == (None, None)


def test_a_kept_draft_that_cannot_be_read_is_left_with_a_one_line_problem() -> None:
    kept_draft_path().write_bytes(b"\xff\xfe not text")
    text, problem = take_kept_draft()
    assert text is None and problem is not None and DRAFT_FILE in problem and "\n" not in problem
    assert kept_draft_path().exists()  # for the user to open
    kept_draft_path().unlink()
    os.mkfifo(kept_draft_path())  # never waited on
    text, problem = take_kept_draft()
    assert text is None and problem is not None and "\n" not in problem


def test_a_draft_that_cannot_be_kept_says_so_in_one_line(localpers_home: Path) -> None:
    kept_draft_path().mkdir()  # a folder where the file goes
    problem = keep_draft("words")
    assert problem is not None and problem.startswith("the draft could not be kept") and "\n" not in problem
