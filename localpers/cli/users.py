"""The `localpers user ...` and `localpers history ...` commands (Typer sub-apps added by `localpers.cli.main`).

`user`: create, list, use, show, delete, export, import the users on this device.
`history`: import, add, list, remove the writing examples of a user (the active one unless --user).
Commands stay thin: `localpers.users.store` and `localpers.users.history` do the work. Nothing here fits vectors.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from localpers.errors import LocalpersError
from localpers.tasks import TASKS
from localpers.untrusted import one_line
from localpers.users.history import (
    DEFAULT_TASK,
    MAX_HISTORY_ITEMS,
    HistoryItem,
    check_history_size,
    merge_history,
    parse_history,
)
from localpers.users.store import UserStore

user_app = typer.Typer(
    help="Create, choose, inspect, export and delete the users on this device.", no_args_is_help=True
)
history_app = typer.Typer(
    help="Manage a user's writing history (the examples the user vector is fitted on).", no_args_is_help=True
)

F = TypeVar("F")

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]
UserOption = Annotated[
    str | None, typer.Option("--user", "-u", help="The user to act on (default: the active user).")
]
REFIT_HINT = (
    "rewrites use the history now; run `localpers fit` to refit CARD's correction"
    " (the vector and habits) to it"
)


def _one_line_errors(func: F) -> F:
    """`localpers.cli.common.one_line_errors`, applied when the command runs."""

    @functools.wraps(func)  # type: ignore[arg-type]
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from localpers.cli.common import one_line_errors

        return one_line_errors(func)(*args, **kwargs)  # type: ignore[type-var]

    return wrapper  # type: ignore[return-value]


def _print_json(payload: Any) -> None:
    typer.echo(json.dumps(payload, indent=2, ensure_ascii=False))


# ---------------------------------------------------------------- user


@user_app.command("create")
@_one_line_errors
def user_create(
    name: Annotated[str, typer.Argument(help="1-32 lowercase letters, digits, '-' or '_'.")],
    use: Annotated[bool, typer.Option("--use/--no-use", help="Make the new user the active one.")] = True,
    as_json: JsonOption = False,
) -> None:
    """Create a new, empty user (and make it active unless --no-use)."""
    store = UserStore()
    user = store.create(name)
    if use:
        store.use(name)
    active = store.active_name() == name
    if as_json:
        _print_json({"name": user.name, "dir": str(user.dir), "active": active})
        return
    typer.echo(f"created user {name!r}{' (active)' if active else ''}")
    typer.echo("next: `localpers history import FILE` or `localpers history add --input ... --output ...`")


@user_app.command("list")
@_one_line_errors
def user_list(as_json: JsonOption = False) -> None:
    """List the users; the active one is marked with *."""
    store = UserStore()
    names = store.list()
    active = store.active_name()
    if as_json:
        _print_json({"users": [{"name": n, "active": n == active} for n in names], "active": active})
        return
    if not names:
        typer.echo("no users yet; create one with `localpers user create NAME`", err=True)
        return
    for name in names:
        typer.echo(f"{'*' if name == active else ' '} {name}")


@user_app.command("use")
@_one_line_errors
def user_use(name: Annotated[str, typer.Argument(help="An existing user.")]) -> None:
    """Make NAME the active user (the default for history, fit and rewrite)."""
    UserStore().use(name)
    typer.echo(f"active user: {name}")


@user_app.command("show")
@_one_line_errors
def user_show(
    name: Annotated[str | None, typer.Argument(help="A user (default: the active one).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Show a user's history size, cluster, fitted vector and fit report."""
    store = UserStore()
    user = store.resolve(name)
    state = user.state()
    history = user.history()
    vector = user.vector()
    report: dict[str, Any] = {
        "name": user.name,
        "active": store.active_name() == user.name,
        "dir": str(user.dir),
        "history_items": len(history),
        "tasks": dict(Counter(item.task for item in history)),
        "cluster": state.get("cluster"),
        "vector": None
        if vector is None
        else {
            "dim": int(vector.size),
            "sha256": state.get("vector_sha256"),
            "metadata": user.vector_metadata(),
        },
        "state": state,
        "disk_bytes": user.disk_bytes(),
    }
    if as_json:
        _print_json(report)
        return
    tasks = ", ".join(f"{task}: {count}" for task, count in report["tasks"].items())
    typer.echo(f"user        {user.name}{' (active)' if report['active'] else ''}")
    typer.echo(f"folder      {user.dir}")
    typer.echo(f"history     {_items(len(history))}{f' ({tasks})' if tasks else ''}")
    typer.echo(f"cluster     {report['cluster'] if report['cluster'] is not None else 'not assigned'}")
    if vector is None:
        typer.echo("vector      none (run `localpers fit`)")
    else:
        typer.echo(f"vector      D={vector.size}, sha256 {str(state.get('vector_sha256'))[:16]}")
    typer.echo(f"fitted      {_fit_freshness(state.get('fit'), len(history))}")
    for label, text in _state_summary(state):
        typer.echo(f"{label:<11} {text}")
    typer.echo(f"disk        {report['disk_bytes']} bytes")


# state.json keys that the lines above show, or that only the files' bookkeeping needs.
_SHOWN_STATE_KEYS = frozenset({"cluster", "vector_file", "vector_sha256", "vector_dim"})
_SUMMARISED_STATE_KEYS = frozenset(
    {"fit", "choice", "token_bias", "bundle_sha256", "created_at", "updated_at"}
)
_LONGEST_OTHER_VALUE = 100


def _state_summary(state: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, text) lines that say what a stored fit holds; `--json` keeps every number.

    The token bias's tables and every candidate's score are summarised, not printed: hundreds of token ids
    tell a person nothing (`localpers profile` shows the habits and series in words).
    """
    lines: list[tuple[str, str]] = []
    fit = state.get("fit")
    if isinstance(fit, dict):
        lines.append(("fit", _fit_line(fit)))
    choice = state.get("choice")
    if isinstance(choice, dict) and isinstance(choice.get("label"), str):
        reason = choice.get("reason")
        lines.append(
            ("correction", f"{choice['label']}" + (f": {reason}" if isinstance(reason, str) else ""))
        )
    habits = fit.get("habits") if isinstance(fit, dict) else None
    if isinstance(habits, list) and habits:
        lines.append(("habits", "; ".join(str(habit) for habit in habits)))
    bias = state.get("token_bias")
    if isinstance(bias, dict):
        lines.append(("token bias", _token_bias_line(bias)))
    if isinstance(state.get("bundle_sha256"), str):
        lines.append(("bundle", f"sha256 {state['bundle_sha256'][:16]} (the bundle the fit was made with)"))
    for key in ("created_at", "updated_at"):
        if isinstance(state.get(key), str):
            lines.append((key.replace("_at", ""), state[key]))
    for key, value in state.items():
        if key not in _SHOWN_STATE_KEYS | _SUMMARISED_STATE_KEYS:
            text = json.dumps(value, ensure_ascii=False)
            if len(text) > _LONGEST_OTHER_VALUE:
                text = text[: _LONGEST_OTHER_VALUE - 1] + "…"
            lines.append((key, text))
    return lines


def _fit_line(fit: dict[str, Any]) -> str:
    """e.g. "vector; 37 pairs, held-out pair accuracy 0.78 on 9 (cluster default 0.89); 14.3 s"."""
    parts = [str(fit.get("mode", "unknown mode"))]
    if isinstance(fit.get("n_pairs"), int):
        pairs = f"{fit['n_pairs']} pair{'' if fit['n_pairs'] == 1 else 's'}"
        accuracy, n_heldout = fit.get("heldout_accuracy"), fit.get("n_heldout")
        if isinstance(accuracy, int | float) and isinstance(n_heldout, int) and n_heldout:
            pairs += f", held-out pair accuracy {accuracy:.2f} on {n_heldout}"
            default = fit.get("heldout_accuracy_default")
            if isinstance(default, int | float):
                pairs += f" (cluster default {default:.2f})"
        parts.append(pairs)
    seconds = fit.get("seconds")
    if isinstance(seconds, dict):
        total = sum(value for value in seconds.values() if isinstance(value, int | float))
        parts.append(f"{total:.1f} s")
    return "; ".join(parts)


def _token_bias_line(bias: dict[str, Any]) -> str:
    """How many tokens each of the bias's tables moves, and its spelling and casing habits."""
    counts = [
        f"{len(bias[name])} {label}"
        for name, label in (
            ("first", "first-word"),
            ("rest", "later-word"),
            ("opening", "opening"),
            ("closing", "closing"),
        )
        if isinstance(bias.get(name), list) and bias[name]
    ]
    extras = [name for name in ("recasing", "respelling") if bias.get(name)]
    text = ", ".join(counts) + " tokens" if counts else "no tokens"
    return text + (f"; {' and '.join(extras)}" if extras else "")


def _fit_freshness(fit: Any, n_history: int) -> str:
    """Whether the stored fit saw the history as it is now (item counts; `--history-limit` fits fewer)."""
    if not isinstance(fit, dict) and n_history == 0:
        return "no (no history yet)"
    if not isinstance(fit, dict):
        return "no (rewrites show your history without CARD's correction until `localpers fit`)"
    fitted_on = fit.get("n_items")
    if fitted_on == n_history:
        return f"on the {_items(n_history)} the history holds"
    return f"on {_items(int(fitted_on or 0))}; the history holds {n_history} now (`localpers fit` refits)"


@user_app.command("delete")
@_one_line_errors
def user_delete(
    name: Annotated[str, typer.Argument(help="The user to delete.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete a user and every trace of it: history, vector, state and the active pointer."""
    store = UserStore()
    user = store.get(name)
    if not yes:
        try:
            contents = f"{_items(len(user.history()))} of history"
        except LocalpersError:
            contents = "a damaged history"  # deleting must still work when the files are damaged
        typer.confirm(
            f"Delete user {name!r} ({contents}, its vector and state)? This cannot be undone", abort=True
        )
    store.delete(name)
    typer.echo(f"deleted user {name!r}")


@user_app.command("export")
@_one_line_errors
def user_export(
    name: Annotated[str | None, typer.Argument(help="The user to export (default: the active one).")] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="Zip file or existing folder (default: ./localpers-user-NAME.zip)."
        ),
    ] = None,
    with_history: Annotated[
        bool, typer.Option("--with-history", help="Include the history (your own text); off by default.")
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Write a user's vector, cluster and state to one .zip; the history only with --with-history."""
    store = UserStore()
    user = store.resolve(name)
    dest = store.export(
        user.name, output if output is not None else Path.cwd(), with_history, overwrite=force
    )
    if as_json:
        _print_json({"user": user.name, "archive": str(dest), "with_history": with_history})
        return
    typer.echo(f"exported user {user.name!r} to {dest}{' (with history)' if with_history else ''}")


@user_app.command("import")
@_one_line_errors
def user_import(
    archive: Annotated[Path, typer.Argument(help="A .zip written by `localpers user export`.")],
    new_name: Annotated[str | None, typer.Option("--as", help="Import under this name instead.")] = None,
    use: Annotated[bool, typer.Option("--use/--no-use", help="Make the imported user active.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Create a user from an exported archive (checked before the user appears)."""
    store = UserStore()
    user = store.import_(archive, new_name)
    if use:
        store.use(user.name)
    active = store.active_name() == user.name
    if as_json:
        _print_json({"name": user.name, "dir": str(user.dir), "active": active})
        return
    typer.echo(f"imported user {user.name!r}{' (active)' if active else ''}")


# ---------------------------------------------------------------- history


def _item_json(item: HistoryItem) -> dict[str, Any]:
    return item.to_json()


@history_app.command("import")
@_one_line_errors
def history_import(
    file: Annotated[
        Path, typer.Argument(help="JSONL: {input, output}, {task, input, output} or per-user lines.")
    ],
    user: UserOption = None,
    user_id: Annotated[
        str | None, typer.Option("--user-id", help="Which user_id to take from a per-user file.")
    ] = None,
    task: Annotated[
        str, typer.Option("--task", "-t", help="Task of items that do not name one.")
    ] = DEFAULT_TASK,
    keep_latest: Annotated[
        int | None,
        typer.Option(
            "--keep-latest",
            min=1,
            max=MAX_HISTORY_ITEMS,
            help="Import only the file's N latest items (its last lines; older ones are left out).",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Add the items of a JSONL file to a user's history; duplicates are reported and skipped."""
    target = UserStore().resolve(user)
    parsed = parse_history(file, user_id=user_id, default_task=task, keep_latest=keep_latest)
    with target.locked():
        merged, already = merge_history(target.history(), parsed.items)
        check_history_size(len(merged), what=f"user {target.name!r} would have")
        target.save_history(merged)
    added = len(parsed.items) - len(already)
    if as_json:
        _print_json(
            {
                "user": target.name,
                "added": added,
                "duplicates_in_file": [asdict(d) for d in parsed.duplicates],
                "already_in_history": [item.id for item in already],
                "older_left_out": parsed.older_left_out,
                "total": len(merged),
            }
        )
        return
    for duplicate in parsed.duplicates:
        typer.echo(f"skipped {duplicate.where}: same text as {duplicate.first_seen}", err=True)
    for item in already:
        typer.echo(f"skipped {one_line(str(item.source))}: already in the history as {item.id}", err=True)
    if parsed.older_left_out:
        typer.echo(
            f"left out the file's {_items(parsed.older_left_out)} before its latest {keep_latest}", err=True
        )
    skipped = len(parsed.duplicates) + len(already)
    typer.echo(
        f"imported {_items(added)} into user {target.name!r}"
        f"{f' ({skipped} duplicates skipped)' if skipped else ''}; it now has {_items(len(merged))}"
    )
    if added:
        typer.echo(REFIT_HINT)


@history_app.command("add")
@_one_line_errors
def history_add(
    input: Annotated[
        str, typer.Option("--input", "-i", help="What the text was written for (e.g. the article).")
    ],
    output: Annotated[str, typer.Option("--output", "-o", help="What the user wrote (e.g. their headline).")],
    task: Annotated[
        str, typer.Option("--task", "-t", help="headline, title, paraphrase or free.")
    ] = DEFAULT_TASK,
    user: UserOption = None,
    as_json: JsonOption = False,
) -> None:
    """Add one example to a user's history (adding the same text again changes nothing)."""
    target = UserStore().resolve(user)
    try:
        item = HistoryItem.create(task, input, output, source="cli", strict=True)
    except ValueError as exc:
        raise LocalpersError(f"cannot add this item: {exc}") from None
    with target.locked():
        merged, already = merge_history(target.history(), [item])
        if not already:
            check_history_size(len(merged), what=f"user {target.name!r} would have")
            target.save_history(merged)
    if as_json:
        _print_json(
            {"user": target.name, "added": not already, "item": _item_json(item), "total": len(merged)}
        )
        return
    if already:
        typer.echo(f"already in the history of {target.name!r} as {item.id}; nothing added", err=True)
        return
    typer.echo(f"added {item.id} to user {target.name!r}; it now has {_items(len(merged))}")
    typer.echo(REFIT_HINT)


@history_app.command("list")
@_one_line_errors
def history_list(user: UserOption = None, as_json: JsonOption = False) -> None:
    """List a user's history items: id, task and the user's text."""
    target = UserStore().resolve(user)
    items = target.history()
    if as_json:
        _print_json({"user": target.name, "items": [_item_json(item) for item in items]})
        return
    if not items:
        typer.echo(
            f"user {target.name!r} has no history yet; add some with `localpers history import FILE`",
            err=True,
        )
        return
    for item in items:
        # Items are cleaned of control characters when read; one_line also keeps each on its row.
        typer.echo(f"{item.id}  {item.task:<9} {one_line(item.output)}")
        typer.echo(f"{'':12}  {'':<9} <- {one_line(_shorten(TASKS[item.task].content(item.input), 100))}")


def _shorten(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _items(count: int) -> str:
    return f"{count} item{'' if count == 1 else 's'}"


@history_app.command("remove")
@_one_line_errors
def history_remove(
    item_id: Annotated[
        str, typer.Argument(metavar="ID", help="An item id from `history list` (a unique prefix works).")
    ],
    user: UserOption = None,
) -> None:
    """Remove one item from a user's history."""
    target = UserStore().resolve(user)
    wanted = item_id.strip().lower()
    with target.locked():
        items = target.history()
        matches = [item for item in items if item.id.startswith(wanted)] if len(wanted) >= 4 else []
        if not matches:
            raise LocalpersError(
                f"no history item {item_id!r} in user {target.name!r} (use at least 4 characters of an id "
                "from `localpers history list`)"
            )
        if len(matches) > 1:
            raise LocalpersError(f"{item_id!r} matches {len(matches)} items; give more characters of the id")
        remaining = [item for item in items if item.id != matches[0].id]
        target.save_history(remaining)
    typer.echo(f"removed {matches[0].id} from user {target.name!r}; {_items(len(remaining))} left")
    typer.echo(REFIT_HINT)
