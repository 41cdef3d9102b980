"""Reading a history file a user imports: its two JSONL formats, dates, duplicates and `--keep-latest`.

    {"input": "...", "output": "..."}                    one item per line, task = the default
    {"task": "headline", "input": "...", "output": "..."}
    {"user_id": "u003", "history": [{"input", "output", ...}, ...], ...}   the shared-data user format

Errors name the file and line ("history.jsonl line 7: missing field 'output'"). Blank lines are skipped,
duplicates are reported and skipped, an ISO 8601 "date" on every item orders them, and a file may hold at most
`MAX_HISTORY_ITEMS` items (or `keep_latest` takes its last ones). This module stores nothing: the items and
their validation are `localpers.users.history`'s, and `localpers.users.store` keeps them per user.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localpers.errors import InputError
from localpers.tasks import TASKS
from localpers.untrusted import one_line
from localpers.users.dates import item_time, oldest_first
from localpers.users.history import (
    DEFAULT_TASK,
    MAX_HISTORY_ITEMS,
    HistoryItem,
    check_history_size,
    item_from_record,
    printable_name,
    read_json_lines,
)


@dataclass
class Duplicate:
    """An item that was skipped because the same text was already seen."""

    where: str
    item_id: str
    first_seen: str


@dataclass
class ParsedHistory:
    """The unique items of a file, in file order, and the duplicates that were skipped."""

    items: list[HistoryItem] = field(default_factory=list)
    duplicates: list[Duplicate] = field(default_factory=list)
    older_left_out: int = 0  # unique items before the `keep_latest` last ones, not returned
    sorted_by_date: bool = False  # every item had a "date" and the file listed them out of order
    # lines without a "date" in a file whose dated lines are out of order (the file's order is then kept)
    undated: int = 0


def parse_history_file(
    path: Path | str, *, user_id: str | None = None, default_task: str = DEFAULT_TASK
) -> list[HistoryItem]:
    """The unique history items of a JSONL file (see the module docstring for the formats)."""
    return parse_history(path, user_id=user_id, default_task=default_task).items


def parse_history(
    path: Path | str,
    *,
    user_id: str | None = None,
    default_task: str = DEFAULT_TASK,
    keep_latest: int | None = None,
    data: bytes | None = None,
    too_many_hint: str | None = None,
    choose_user_hint: str = "choose one with --user-id",
) -> ParsedHistory:
    """Like `parse_history_file`, also returning the duplicates that were skipped.

    Items are taken in the file's order (the oldest first, as a history lists them), or by their "date" fields
    when every item has one and the file lists them otherwise (`sorted_by_date`). `keep_latest` keeps only the last
    that many unique items in that order, so a longer archive can be imported without editing it; every line is still validated. `data` is the
    file's content when it was read elsewhere (standard input); `path` then only names it in messages.
    `too_many_hint` says how to import a file of more than `MAX_HISTORY_ITEMS` where `--keep-latest` is not offered,
    `choose_user_hint` how to pick one user of a file of several where `--user-id` is not.
    """
    path = Path(path)
    if keep_latest is not None and not 1 <= keep_latest <= MAX_HISTORY_ITEMS:
        raise InputError(f"--keep-latest {keep_latest}: choose 1 to {MAX_HISTORY_ITEMS}")
    if default_task not in TASKS:
        raise InputError(f"unknown task {default_task!r}; choose one of: {', '.join(TASKS)}")
    records = list(read_json_lines(path, data=data))
    if not records:
        raise InputError(f"{path} has no history items; expected JSONL lines with 'input' and 'output'")

    user_lines = [(n, r) for n, r in records if "user_id" in r or "history" in r]
    if user_lines and len(user_lines) != len(records):
        plain_line = next(n for n, r in records if not ("user_id" in r or "history" in r))
        raise InputError(
            f"{path} line {plain_line}: a plain item in a file of per-user lines "
            "(with 'user_id' and 'history'); use one format per file"
        )
    if user_lines:
        candidates = _user_items(path, user_lines, user_id, choose_user_hint)
    else:
        if user_id is not None:
            raise InputError(
                f"{path} holds plain items, not per-user lines; --user-id applies only to "
                "files with 'user_id' and 'history' lines"
            )
        candidates = [(f"line {n}", r, f"{printable_name(path)}:{n}") for n, r in records]

    parsed = ParsedHistory()
    # "recent" (the prompt's examples, --keep-latest, --oldest) is the order items are added: a dated file out of
    # order is taken oldest first, as `localpers bench` reads the same format (which does not refuse a bad date:
    # the corpus is not the user's to mend)
    _check_dates(path, candidates)
    candidates, parsed.sorted_by_date = oldest_first(candidates, lambda candidate: candidate[1])
    times = [
        item_time(record) for _, record, _ in candidates if isinstance(record, dict) and "date" in record
    ]
    known = [moment for moment in times if moment is not None]
    # partly dated and out of order: the file's order stays, which the user may not expect
    if known != sorted(known):
        parsed.undated = len(candidates) - len(known)
    first_seen: dict[str, str] = {}
    for where, record, source in candidates:
        item = item_from_record(path, where, record, default_task, source, strict=True)
        if item.id in first_seen:
            parsed.duplicates.append(Duplicate(where, item.id, first_seen[item.id]))
            continue
        first_seen[item.id] = where
        parsed.items.append(item)
    if keep_latest is not None and len(parsed.items) > keep_latest:
        parsed.older_left_out = len(parsed.items) - keep_latest
        parsed.items = parsed.items[-keep_latest:]
    check_history_size(
        len(parsed.items),
        what=f"{path} has",
        hint=too_many_hint or f"or import its latest with --keep-latest {MAX_HISTORY_ITEMS}",
    )
    return parsed


def _check_dates(path: Path, candidates: list[tuple[str, dict[str, Any], str]]) -> None:
    """Refuse a "date" that is not an ISO 8601 date: it was meant to order the items, and would silently not."""
    for where, record, _ in candidates:
        value = record.get("date") if isinstance(record, dict) else None  # a non-object is refused later
        if value not in (None, "") and item_time(record) is None:  # "": a CSV export's empty column
            raise InputError(
                f"{path} {where}: field 'date' is {one_line(repr(value), 40)}, not a valid ISO 8601 date"
                " (YYYY-MM-DD, or with a time: 2024-05-01T09:30); fix it or leave the field out"
            )


def _user_items(
    path: Path, user_lines: list[tuple[int, dict[str, Any]]], user_id: str | None, choose_user_hint: str
) -> list[tuple[str, Any, str]]:
    """The history records of the chosen user in a per-user file, with where each one came from."""
    by_user: dict[str, tuple[int, dict[str, Any]]] = {}
    for line_number, record in user_lines:
        uid = record.get("user_id")
        if isinstance(uid, int) and not isinstance(uid, bool):
            uid = str(uid)  # numbered authors, as `localpers publish` and `bench` read them (--user-id 7)
        if not isinstance(uid, str) or not uid:
            raise InputError(
                f"{path} line {line_number}: field 'user_id' must be a non-empty string or an integer"
            )
        if uid in by_user:
            raise InputError(
                f"{path} line {line_number}: user_id {uid!r} already appeared on line {by_user[uid][0]}; a"
                " file of several users has one line per user, holding all of their items:"
                ' {"user_id": ..., "history": [{"input": ..., "output": ...}, ...]}'
            )
        by_user[uid] = (line_number, record)

    if user_id is None:
        if len(by_user) > 1:
            shown = ", ".join(list(by_user)[:5]) + (", ..." if len(by_user) > 5 else "")
            raise InputError(f"{path} holds {len(by_user)} users ({shown}); {choose_user_hint}")
        user_id = next(iter(by_user))
    if user_id not in by_user:
        raise InputError(f"{path} has no user_id {user_id!r}; it holds: {', '.join(by_user)}")

    line_number, record = by_user[user_id]
    history = record.get("history")
    if not isinstance(history, list):
        raise InputError(f"{path} line {line_number}: field 'history' must be a list of items")
    if not history:  # refused as an empty plain file is: "imported 0 items" looked like success
        raise InputError(
            f"{path} line {line_number} (user {one_line(user_id, 40)}) has no history items; expected a"
            " 'history' list of objects with 'input' and 'output'"
        )
    candidates = []
    for index, entry in enumerate(history, start=1):
        where = f"line {line_number} (user {user_id}) history item {index}"
        original_id = entry.get("id") if isinstance(entry, dict) else None
        label = original_id if isinstance(original_id, str) and original_id else str(index)
        candidates.append((where, entry, f"{printable_name(path)}:{user_id}/{label}"))
    return candidates
