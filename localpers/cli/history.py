"""The `localpers history ...` group and its import, add and list commands (a user's writing examples).

Commands stay thin: `localpers.users.history_import` parses a file, `localpers.users.history` merges items,
`localpers.users.store` finds the user and writes atomically under its lock. `history remove` is in
`localpers.cli.history_remove`, added to this group by `localpers.cli.main`. Nothing here fits a vector or builds a
prompt.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from localpers.cli import completion
from localpers.cli.common import (
    JsonOption,
    UserOption,
    checked_utf8,
    counted,
    echo,
    items_phrase,
    note_saved,
    one_line_errors,
    print_json,
    read_text_argument,
)
from localpers.cli.history_hints import refit_hint
from localpers.errors import InputError
from localpers.tasks import TASKS
from localpers.untrusted import one_line
from localpers.users.history import (
    DEFAULT_TASK,
    MAX_HISTORY_FILE_BYTES,
    MAX_HISTORY_ITEMS,
    HistoryItem,
    check_history_size,
    merge_history,
)
from localpers.users.history_import import parse_history
from localpers.users.store import UserStore

history_app = typer.Typer(
    help="Manage a user's writing history (the examples rewrites show and `localpers fit` learns from).",
    no_args_is_help=True,
)


SKIPPED_LINES_SHOWN = 20  # skipped items named one per line on stderr; --json has every one
STDIN_NAME = "standard input"  # how messages and item sources name a history piped in


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


def make_room_hint(user_name: str, over: int) -> str:
    """How to free `over` places in a full history from the command line."""
    return f"make room with `localpers history remove --oldest {over} --user {user_name}`"
