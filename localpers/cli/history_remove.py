"""`localpers history remove`: take one item, or the N oldest, out of a user's history.

The removal itself (the history file, its index and what was derived from the removed items) is
`localpers.methods.forget`'s; this module resolves which items go, asks before a whole history goes, and says
what is left and what to refit. `register` adds the command to the `history` group of `localpers.cli.history`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated

import typer

from localpers.cli.common import (
    JsonOption,
    UserOption,
    ask_yes_no,
    echo,
    items_phrase,
    note_saved,
    one_line_errors,
    print_json,
)
from localpers.cli.history_hints import refit_hint
from localpers.errors import InputError, LocalpersError
from localpers.users.history import HistoryItem
from localpers.users.store import User, UserStore

MIN_ID_PREFIX = 4  # characters of an item id `history remove` needs: fewer match several items by chance


def register(history_app: typer.Typer) -> None:
    """Add `remove` to the `history` group, with one-line error handling."""
    history_app.command("remove")(one_line_errors(history_remove))


def history_remove(
    item_id: Annotated[
        str | None,
        typer.Argument(
            metavar="ID",
            help="An item id from `history list` (a unique prefix of 4 or more characters works).",
        ),
    ] = None,
    oldest: Annotated[
        int | None,
        typer.Option(
            "--oldest",
            min=1,
            help="Remove the N oldest items instead (the first N of `history list`): room for newer ones.",
        ),
    ] = None,
    yes: Annotated[
        bool,
        typer.Option(
            "--yes", "-y", help="Do not ask for confirmation when --oldest N takes the whole history."
        ),
    ] = False,
    user: UserOption = None,
    as_json: JsonOption = False,
) -> None:
    """Remove one item from a user's history, or its N oldest with --oldest N."""
    from localpers.methods.forget import remove_history_items

    if item_id is None and oldest is None:
        raise InputError("give an item ID or --oldest N")
    if item_id is not None and oldest is not None:
        raise InputError("give an item ID or --oldest N (not both)")
    target = UserStore().resolve(user)
    if oldest is not None:
        _remove_oldest(target, oldest, yes=yes, as_json=as_json)
        return
    assert item_id is not None
    wanted = item_id.strip().lower()
    if len(wanted) < MIN_ID_PREFIX:  # whether or not items start with it: a few characters pick one by chance
        raise InputError(
            f"{item_id!r} is too short: give at least {MIN_ID_PREFIX} characters of an id from"
            " `localpers history list`"
        )

    def the_matching_item(items: list[HistoryItem]) -> set[str]:
        matches = {item.id for item in items if item.id.startswith(wanted)}
        if not matches:
            raise LocalpersError(
                f"no history item {item_id!r} in user {target.name!r} (use an id from `localpers history list`)"
            )
        if len(matches) > 1:
            raise LocalpersError(f"{item_id!r} matches {len(matches)} items; give more characters of the id")
        return matches

    removed, remaining = remove_history_items(
        target, the_matching_item, on_saved=_note_remaining(target.name)
    )
    if as_json:
        _print_removed(target, removed, remaining)
        return
    echo(f"removed {removed[0].id} from user {target.name!r}; {items_phrase(len(remaining))} left")
    if hint := refit_hint(target, remaining, removed=True):
        echo(hint)


def _print_removed(target: User, removed: list[HistoryItem], remaining: list[HistoryItem]) -> None:
    print_json({"user": target.name, "removed": [item.id for item in removed], "total": len(remaining)})


def _remove_oldest(target: User, count: int, *, yes: bool, as_json: bool) -> None:
    """Remove the `count` oldest items (the history lists the oldest first), then what was derived from them; one
    that takes the whole history is asked about first, as `user delete` asks, unless `yes`."""
    from localpers.methods.forget import remove_history_items

    may_empty = yes or _confirmed_emptying(target, count, as_json)

    def the_oldest(items: list[HistoryItem]) -> set[str]:
        if not items:
            raise LocalpersError(f"user {target.name!r} has no history items to remove")
        if count >= len(items) and not may_empty:  # items were removed elsewhere since the history was read
            raise _emptying_refused(target, count, len(items))
        return {item.id for item in items[:count]}

    removed, remaining = remove_history_items(target, the_oldest, on_saved=_note_remaining(target.name))
    if as_json:
        _print_removed(target, removed, remaining)
        return
    which = f"the newest of them {removed[-1].id}" if len(removed) > 1 else removed[0].id
    echo(
        f"removed the oldest {items_phrase(len(removed))} from user {target.name!r}"
        f" ({which}); {items_phrase(len(remaining))} left"
    )
    if hint := refit_hint(target, remaining, removed=True):
        echo(hint)


def _confirmed_emptying(target: User, count: int, as_json: bool) -> bool:
    """Whether the person at the terminal agreed that the `count` oldest items, the whole history, go; False where
    they are not the whole history. Refused (nothing removed) when they said no, or when no one can be asked."""
    size = len(target.history())
    if not 0 < size <= count:
        return False
    if not asks_a_person():
        raise _emptying_refused(target, count, size)
    question = (
        f"Remove the whole history of user {target.name!r} ({items_phrase(size)})? This cannot be undone"
    )
    if not ask_yes_no(question, err=True):  # seen with stdout redirected, and never inside --json's output
        raise LocalpersError(f"nothing was removed from user {target.name!r}")
    return True


def _emptying_refused(target: User, count: int, size: int) -> LocalpersError:
    return LocalpersError(
        f"--oldest {count} would remove the whole history of user {target.name!r} ({items_phrase(size)}); add"
        " `--yes` to remove it all"
    )


def asks_a_person() -> bool:
    """Whether standard input is a terminal, so a question can be answered (a script's pipe must say --yes)."""
    return sys.stdin is not None and sys.stdin.isatty()


def _note_remaining(name: str) -> Callable[[list[HistoryItem]], None]:
    """What `remove_history_items` calls once the history is written: a stop from then on came after the work."""
    return lambda remaining: note_saved(f"user {name!r} now has {items_phrase(len(remaining))}")
