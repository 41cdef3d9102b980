"""The draft a stop signal left: kept when a closed terminal or `kill` ends the TUI, offered back at the next start.

ctrl+q asks before it drops a draft; SIGTERM and SIGHUP cannot ask, so the app writes the draft to `tui-draft.txt`
in the data folder (`localpers.paths.data_dir`, beside the users' histories, never anywhere else), atomically, and
the next `localpers tui` without `--text` opens with it and removes the file. Writing or reading it never fails the
app: each gives back a one-line problem to show instead. This module holds no widget and decides nothing about when.
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


def keep_draft(text: str) -> str | None:
    """Write `text` for the next start; a one-line problem when it cannot be written (None when it was)."""
    try:
        atomic_write_text(kept_draft_path(), text)
    except (LocalpersError, OSError) as exc:
        return f"the draft could not be kept ({one_line(str(exc), limit=200)})"
    return None


def take_kept_draft() -> tuple[str | None, str | None]:
    """(the draft an earlier stop kept, or None; a one-line problem, or None). A draft read is removed: it is in
    the editor now. One that cannot be read is left where it is, for the user to open."""
    try:
        path = kept_draft_path()
        if not path.exists() and not path.is_symlink():
            return None, None
        text = read_regular_file(path, DRAFT_LIMIT, what="kept draft", stored=True).decode("utf-8")
        path.unlink()
    except UnicodeDecodeError:
        return (
            None,
            f"{kept_draft_path()} is not UTF-8 text; it was not opened (remove it when done)",
        )
    except (LocalpersError, OSError) as exc:
        return None, f"the draft kept at the last stop cannot be opened ({one_line(str(exc), limit=200)})"
    return text, None
