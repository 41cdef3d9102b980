"""What of a user goes into an export archive, and what an archive says of the fit it carries.

`fit_members` reads a user's state.json and the vector it names as one pair; `marked_for_history` marks the
archived state `imported_without_history` when the archive leaves out the history its fit stands for (so a `fit`
after the import keeps it); `archived_fit_kept_on_refit` reads that mark back from an archive. Writing and
reading the zip itself is `localpers.users.archive`'s; where an imported user lands is
`localpers.users.store.UserStore`'s. This module writes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from localpers.errors import LocalpersError
from localpers.regular_files import STATE_FILE_LIMIT, read_regular_file
from localpers.untrusted import parse_json
from localpers.users import folder
from localpers.users.archive import read_archive
from localpers.users.folder import IMPORTED_WITHOUT_HISTORY, User
from localpers.users.history import fitted_on_this_history


def archived_fit_kept_on_refit(archive: Path) -> bool | None:
    """For an archive `export` wrote without the history: whether `fit` after its import keeps the fit it carries
    (the archive marks it `imported_without_history`), read from the archive itself; None where there is no fit to
    lose (none, or a cold start) or the history goes along (a fit there fits it)."""
    _, members = read_archive(archive)
    state = parse_json(members["state.json"]) if "state.json" in members else None
    if "history.jsonl" in members or not isinstance(state, dict) or state.get("cluster") is None:
        return None
    return bool(state.get(IMPORTED_WITHOUT_HISTORY))


def marked_for_history(user: User, state: dict[str, Any], with_history: bool) -> bytes:
    """The archived state.json, marked `imported_without_history` when the archive leaves out the history its fit
    stands for (`_fit_is_of_history_now`). `fit` keeps such a fit after the import
    (`user_fit.fit_without_history`); any other (a fit of items removed since, which a fit here must forget) is
    fitted anew."""
    marked = {key: value for key, value in state.items() if key != IMPORTED_WITHOUT_HISTORY}
    if not with_history and _fit_is_of_history_now(user, state):
        marked[IMPORTED_WITHOUT_HISTORY] = True
    return (folder.state_json(marked) + "\n").encode("utf-8")


def _fit_is_of_history_now(user: User, state: dict[str, Any]) -> bool:
    """Whether the fit in `state` is a fit of `user`'s history as it is now (the digest it recorded), or one imported
    without its history and still without items here: what an export without the history may carry so that `fit`
    keeps it after the import."""
    fit = state.get("fit")
    try:
        history = user.history()
    except LocalpersError:
        return False  # unreadable: not known to be what the fit saw
    current = fitted_on_this_history(fit, history)
    return current or (bool(state.get(IMPORTED_WITHOUT_HISTORY)) and history == [])


def fit_members(user: User) -> dict[str, bytes]:
    """The archive members of `user`'s fit: state.json's bytes and the vector they name, read as one pair (a fit
    committed by another command between the reads is read again, as `User.fit_files` does); a damaged or
    inconsistent fit is refused before anything is written."""
    for _ in range(3):
        members: dict[str, bytes] = {}
        if not user.state_path.exists():
            # read as no fit elsewhere; an export would leave the fit out unsaid
            if user.state_path.is_symlink():
                raise LocalpersError(
                    f"{user.state_path} is a link to {os.readlink(user.state_path)}, which does not exist; reconnect"
                    " what it points to before exporting, or remove the link (the user then has no fit)"
                )
            user.state()  # a missing state is a user never fitted, unless the user was deleted meanwhile
            return members
        # a FIFO, a folder or a device there is refused in one line, never read
        raw_state = read_regular_file(user.state_path, STATE_FILE_LIMIT, what="state file", stored=True)
        members["state.json"] = raw_state
        state, _ = user.fit_files()  # refuses a damaged or inconsistent fit (reading again while one commits)
        vector_path = user.vector_path(state)
        try:
            if vector_path is not None:
                members[vector_path.name] = vector_path.read_bytes()
        except FileNotFoundError:  # the vector removed by a fit committed meanwhile
            continue
        if read_regular_file(user.state_path, STATE_FILE_LIMIT, what="state file", stored=True) == raw_state:
            return members  # the pair read is still the stored one
    raise LocalpersError(
        f"user {user.name!r}'s fit kept changing while it was read (another command fitting it?); export again"
        " when that has finished"
    )
