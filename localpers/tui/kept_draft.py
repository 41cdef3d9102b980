"""The draft a stop signal left: kept when a closed terminal or `kill` ends the TUI, offered back at the next start.

ctrl+q asks before it drops a draft; SIGTERM and SIGHUP cannot ask, so the app writes the draft to `tui-draft.txt`
in the data folder (`localpers.paths.data_dir`, beside the users' histories, never anywhere else), atomically, and
the next `localpers tui` without `--text` opens with it and removes the file; a stop before that adds its draft
after the one kept (a start with `--text` leaves it waiting). Writing or reading it never fails the app: each gives
back a one-line problem to show instead. This module holds no widget and decides nothing about when.
"""

from __future__ import annotations

from pathlib import Path

from localpers.atomic import atomic_write_text
from localpers.errors import LocalpersError
from localpers.paths import data_dir
from localpers.regular_files import read_regular_file
from localpers.untrusted import one_line

DRAFT_FILE = "tui-draft.txt"
DRAFT_LIMIT = 4 << 20  # far more than any draft a rewrite takes; anything larger is not ours


def kept_draft_path() -> Path:
    """Where a stop signal keeps the draft: the data folder, beside the users' histories."""
    return data_dir() / DRAFT_FILE


def kept_draft_waits() -> bool:
    """Whether a kept draft waits for a start to reopen it (something is at its path)."""
    path = kept_draft_path()
    try:
        return path.exists() or path.is_symlink()
    except OSError:  # a folder on the way this account cannot read: reading it will say so
        return True


def keep_draft(text: str) -> str | None:
    """Write `text` for the next start; a one-line problem when it cannot be written (None when it was).

    A draft an earlier stop kept that no start has reopened yet (a start with `--text` leaves it; two apps closed
    together both keep theirs) stays: `text` goes after it. One that cannot be read is never replaced.
    """
    if kept_draft_waits():
        earlier, problem = _read_kept_draft()
        if earlier is None:
            return f"the draft could not be kept: {problem or 'the one kept earlier cannot be read'}"
        if earlier.strip() and earlier != text:
            text = earlier.rstrip("\n") + "\n\n" + text
    if len(text.encode("utf-8")) > DRAFT_LIMIT:  # the next start would refuse it as no file localpers writes
        return (
            f"the draft could not be kept: it is more than the {DRAFT_LIMIT:,} bytes a kept draft may have"
            + (" with the one kept earlier" if kept_draft_waits() else "")
        )
    try:
        atomic_write_text(kept_draft_path(), text)
    except (LocalpersError, OSError) as exc:
        return f"the draft could not be kept ({one_line(str(exc), limit=200)})"
    return None


def take_kept_draft() -> tuple[str | None, str | None]:
    """(the draft an earlier stop kept, or None; a one-line problem, or None). A draft read is removed: it is in
    the editor now. One that cannot be read is left where it is, for the user to open."""
    if not kept_draft_waits():
        return None, None
    text, problem = _read_kept_draft()
    if text is not None:
        try:
            kept_draft_path().unlink()
        except OSError as exc:
            return None, f"the draft kept at the last stop cannot be opened ({one_line(str(exc), limit=200)})"
    return text, problem


def _read_kept_draft() -> tuple[str | None, str | None]:
    """(the kept draft's text, None), or (None, why it cannot be read)."""
    path = kept_draft_path()
    try:
        return read_regular_file(path, DRAFT_LIMIT, what="kept draft", stored=True).decode("utf-8"), None
    except UnicodeDecodeError:
        return None, f"{path} is not UTF-8 text; it was not opened (remove it when done)"
    except (LocalpersError, OSError) as exc:
        return None, f"the draft kept at the last stop cannot be opened ({one_line(str(exc), limit=200)})"
