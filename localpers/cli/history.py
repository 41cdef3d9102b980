"""The `localpers history ...` commands: import, add, list and remove a user's writing examples.

Commands stay thin: `localpers.users.history_import` parses a file, `localpers.users.history` merges items,
`localpers.users.store` finds the user and writes atomically under its lock. Nothing here fits a vector or builds a prompt.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from localpers.cli import completion
from localpers.cli.common import (
    JsonOption,
    UserOption,
    ask_yes_no,
    checked_utf8,
    counted,
    echo,
    items_phrase,
    note_saved,
    one_line_errors,
    print_json,
    read_text_argument,
)
from localpers.errors import InputError, LocalpersError
from localpers.methods.stored_files import COPE_STATE_FILE
from localpers.tasks import TASKS
from localpers.untrusted import one_line
from localpers.users.folder import read_json_object
from localpers.users.history import (
    DEFAULT_TASK,
    MAX_HISTORY_FILE_BYTES,
    MAX_HISTORY_ITEMS,
    HistoryItem,
    check_history_size,
    fitted_on_this_history,
    merge_history,
)
from localpers.users.history_import import parse_history
from localpers.users.store import User, UserStore

history_app = typer.Typer(
    help="Manage a user's writing history (the examples rewrites show and `localpers fit` learns from).",
    no_args_is_help=True,
)


SKIPPED_LINES_SHOWN = 20  # skipped items named one per line on stderr; --json has every one
STDIN_NAME = "standard input"  # how messages and item sources name a history piped in
MIN_ID_PREFIX = 4  # characters of an item id `history remove` needs: fewer match several items by chance


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


def _item_json(item: HistoryItem) -> dict[str, Any]:
    return item.to_json()


@history_app.command("import")
@one_line_errors
def history_import(
    file: Annotated[
        Path,
        typer.Argument(
            help="JSONL: {input, output}, {task, input, output} or per-user lines; - reads standard input."
        ),
    ],
    user: UserOption = None,
    user_id: Annotated[
        str | None, typer.Option("--user-id", help="Which user_id to take from a per-user file.")
    ] = None,
    task: Annotated[
        str,
        typer.Option(
            "--task",
            "-t",
            help="Task of items that do not name one: headline, title, paraphrase or free.",
            autocompletion=completion.task_names,
        ),
    ] = DEFAULT_TASK,
    keep_latest: Annotated[
        int | None,
        typer.Option(
            "--keep-latest",
            min=1,
            max=MAX_HISTORY_ITEMS,
            help="Import only the file's N latest items (its last ones, or the newest by date when every item has"
            " one; duplicates skipped; older ones are left out).",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Add the items of a JSONL file to a user's history; duplicates are reported and skipped."""
    target = UserStore().resolve(user)
    if str(file) == "-":  # a pipe, so private text need not be written to a file first
        data = sys.stdin.buffer.read(MAX_HISTORY_FILE_BYTES + 1)
        parsed = parse_history(
            Path(STDIN_NAME), user_id=user_id, default_task=task, keep_latest=keep_latest, data=data
        )
    else:
        parsed = parse_history(file, user_id=user_id, default_task=task, keep_latest=keep_latest)
    with target.locked():
        merged, already = merge_history(target.history(), parsed.items)
        room = MAX_HISTORY_ITEMS - len(merged) + len(parsed.items) - len(already)
        check_history_size(
            len(merged),
            what=f"user {target.name!r} would have",
            hint=make_room_hint(target.name, len(merged) - MAX_HISTORY_ITEMS)
            + (f", or import the file's latest with `--keep-latest {room}`" if room > 0 else ""),
        )
        if len(already) < len(parsed.items):  # nothing new: the stored history stays as it is, unwritten
            target.save_history(
                merged,
                on_saved=lambda: note_saved(f"user {target.name!r} now has {items_phrase(len(merged))}"),
            )
    added = len(parsed.items) - len(already)
    if as_json:
        print_json(
            {
                "user": target.name,
                "added": added,
                "duplicates_in_file": [asdict(d) for d in parsed.duplicates],
                "already_in_history": [item.id for item in already],
                "older_left_out": parsed.older_left_out,
                "sorted_by_date": parsed.sorted_by_date,
                "undated": parsed.undated,
                "total": len(merged),
            }
        )
        return
    skipped_lines = [
        f"skipped {one_line(d.where)}: same text as {one_line(d.first_seen)}" for d in parsed.duplicates
    ] + [f"skipped {one_line(str(item.source))}: already in the history as {item.id}" for item in already]
    for line in skipped_lines[:SKIPPED_LINES_SHOWN]:
        echo(line, err=True)
    if len(skipped_lines) > SKIPPED_LINES_SHOWN:  # a re-imported archive would print one line per item
        echo(
            f"... and {len(skipped_lines) - SKIPPED_LINES_SHOWN} more skipped (`--json` lists them all)",
            err=True,
        )
    if parsed.sorted_by_date:
        echo("the file's items were out of date order: taken oldest first by their 'date' fields", err=True)
    if parsed.undated:
        echo(
            f"{items_phrase(parsed.undated)} of the file {'has' if parsed.undated == 1 else 'have'} no 'date' where"
            " others have one: the file's order is kept (items are taken oldest first by date only when every one"
            " has a date)",
            err=True,
        )
    if parsed.older_left_out:
        echo(
            f"left out the file's {items_phrase(parsed.older_left_out)} before its latest {keep_latest}",
            err=True,
        )
    skipped = len(parsed.duplicates) + len(already)
    skipped_note = f" ({counted(skipped, 'duplicate')} skipped)" if skipped else ""
    echo(
        f"imported {items_phrase(added)} into user {target.name!r}{skipped_note};"
        f" it now has {items_phrase(len(merged))}"
    )
    if added and (hint := refit_hint(target, merged)):
        echo(hint)


@history_app.command("add")
@one_line_errors
def history_add(
    input: Annotated[
        str,
        typer.Option(
            "--input", "-i", help="What the text was written for (e.g. the article); - reads stdin."
        ),
    ],
    output: Annotated[
        str, typer.Option("--output", "-o", help="What the user wrote (e.g. their headline); - reads stdin.")
    ],
    task: Annotated[
        str,
        typer.Option(
            "--task", "-t", help="headline, title, paraphrase or free.", autocompletion=completion.task_names
        ),
    ] = DEFAULT_TASK,
    user: UserOption = None,
    as_json: JsonOption = False,
) -> None:
    """Add one example to a user's history (adding the same text again changes nothing)."""
    target = UserStore().resolve(user)
    if input == "-" and output == "-":
        raise InputError("only one of --input and --output can be - (standard input); give the other as text")
    input, output = (read_text_argument(text) if text == "-" else text for text in (input, output))
    input, output = checked_utf8(input, "--input"), checked_utf8(output, "--output")
    try:
        item = HistoryItem.create(task, input, output, source="cli", strict=True)
    except ValueError as exc:
        raise InputError(f"cannot add this item: {exc}") from None
    with target.locked():
        merged, already = merge_history(target.history(), [item])
        if not already:
            check_history_size(
                len(merged),
                what=f"user {target.name!r} would have",
                hint=make_room_hint(target.name, len(merged) - MAX_HISTORY_ITEMS),
            )
            target.save_history(
                merged,
                on_saved=lambda: note_saved(f"user {target.name!r} now has {items_phrase(len(merged))}"),
            )
    if already:  # the item as stored (its source, its date), not the candidate that matched it
        item = next(stored for stored in merged if stored.id == item.id)
    if as_json:
        print_json(
            {"user": target.name, "added": not already, "item": _item_json(item), "total": len(merged)}
        )
        return
    if already:
        echo(f"already in the history of {target.name!r} as {item.id}; nothing added", err=True)
        return
    echo(f"added {item.id} to user {target.name!r}; it now has {items_phrase(len(merged))}")
    if hint := refit_hint(target, merged):
        echo(hint)


@history_app.command("list")
@one_line_errors
def history_list(
    user: UserOption = None,
    last: Annotated[
        int | None, typer.Option("--last", min=1, help="Only the N most recent items (the list's end).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """List a user's history items, oldest first: id, task and the user's text."""
    target = UserStore().resolve(user)
    items = target.history()
    if last is not None:
        items = items[-last:]
    if as_json:
        print_json({"user": target.name, "items": [_item_json(item) for item in items]})
        return
    if not items:
        echo(
            f"user {target.name!r} has no history yet; add some with `localpers history import FILE --user"
            f" {target.name}`",
            err=True,
        )
        return
    for item in items:
        # Items are cleaned of control characters when read; one_line also keeps each on its row.
        echo(f"{item.id}  {item.task:<9} {one_line(item.output)}")
        echo(f"{'':12}  {'':<9} <- {one_line(_shorten(TASKS[item.task].content(item.input), 100))}")


def _shorten(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


@history_app.command("remove")
@one_line_errors
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


def make_room_hint(user_name: str, over: int) -> str:
    """How to free `over` places in a full history from the command line."""
    return f"make room with `localpers history remove --oldest {over} --user {user_name}`"


def _note_remaining(name: str) -> Callable[[list[HistoryItem]], None]:
    """What `remove_history_items` calls once the history is written: a stop from then on came after the work."""
    return lambda remaining: note_saved(f"user {name!r} now has {items_phrase(len(remaining))}")
