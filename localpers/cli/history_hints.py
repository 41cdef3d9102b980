"""What to tell a person after a history change: the refits that bring a user's stored fits up to date.

Shared by the `history` commands that change a history (`localpers.cli.history`, `localpers.cli.history_remove`).
It reads the stored fit files and writes nothing; it fits nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from localpers.errors import LocalpersError
from localpers.methods.stored_files import COPE_STATE_FILE
from localpers.users.folder import read_json_object
from localpers.users.history import HistoryItem, fitted_on_this_history
from localpers.users.store import User


def refit_hint(user: User, history: list[HistoryItem], *, removed: bool = False) -> str | None:
    """What to run after a history change, or None where the stored fits are of `history` already (an import of
    the items a fit was made from, the removal of an item added since); it names the user, since a bare
    `localpers fit` fits the active one."""
    refits = []
    if not fitted_on_this_history(_stored_json(user.state_path).get("fit"), history):
        refits.append(
            f"`localpers fit --user {user.name}` to refit CARD's correction (the vector and habits) to it"
        )
    cope_state = user.dir / COPE_STATE_FILE
    if cope_state.is_file() and not fitted_on_this_history(_stored_json(cope_state), history):
        # a CoPe adapter's weights change only with its own refit
        refits.append(f"`localpers fit --method cope --user {user.name}` for the CoPe adapter")
    if not refits:
        return None
    now = "rewrites no longer show what was removed" if removed else "rewrites use the history now"
    return f"{now}; run {', and '.join(refits)}"


def _stored_json(path: Path) -> dict[str, Any]:
    """A fit's JSON file as stored; {} when absent or damaged (a refit mends it, so the reminder stays)."""
    try:
        return read_json_object(path, "") or {}
    except LocalpersError:
        return {}
