"""The `localpers user ...` commands: create, list, use, show, delete, export and import this device's users.

Commands stay thin: `localpers.users.store` does the work; `show` only words what state.json holds
(`localpers.cli.user_show` writes those lines). Nothing here fits vectors. The `history` commands are in `localpers.cli.history`
(`remove` in `localpers.cli.history_remove`).
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from localpers.cli import completion
from localpers.cli.common import (
    JsonOption,
    ask_yes_no,
    counted,
    echo,
    items_phrase,
    note_saved,
    one_line_errors,
    print_json,
)
from localpers.cli.user_show import cluster_text, fit_freshness, other_fits, rejected_count, state_summary
from localpers.errors import InputError, LocalpersError
from localpers.methods.stored_files import refit_advice
from localpers.untrusted import one_line
from localpers.users.archive_members import archived_fit_kept_on_refit
from localpers.users.folder import IMPORTED_WITHOUT_HISTORY
from localpers.users.store import User, UserStore

user_app = typer.Typer(
    help="Create, choose, inspect, export and delete the users on this device.", no_args_is_help=True
)


# ---------------------------------------------------------------- user


@user_app.command("create")
@one_line_errors
def user_create(
    name: Annotated[
        str,
        typer.Argument(
            help="1-32 lowercase letters, digits, '-' or '_', starting with a letter or digit (not a Windows"
            " device name such as con)."
        ),
    ],
    use: Annotated[bool, typer.Option("--use/--no-use", help="Make the new user the active one.")] = True,
    as_json: JsonOption = False,
) -> None:
    """Create a new, empty user (and make it active unless --no-use)."""
    store = UserStore()
    user = store.create(name, activate=False)
    note_saved(f"user {name!r} was created")
    not_activated = _activate(store, name, use)
    _say_made(user, "created", store, not_activated, as_json)
    if as_json:
        return
    # a bare `localpers history ...` acts on the active user, which this one is not with --no-use
    for_user = "" if _is_active(store, user.name) else f" --user {user.name}"
    echo(
        f"next: `localpers history import FILE{for_user}` or"
        f" `localpers history add --input ... --output ...{for_user}`"
    )


@user_app.command("list")
@one_line_errors
def user_list(as_json: JsonOption = False) -> None:
    """List the users; the active one is marked with *."""
    store = UserStore()
    store.check_folder()  # a file in the folder's place is not "no users yet"
    names = store.list()
    damaged = None
    try:
        active = store.active_name()
    except LocalpersError as exc:  # a damaged active.json must not hide the users; say so beside them
        active, damaged = None, str(exc)
    if as_json:
        listing = {"users": [{"name": n, "active": n == active} for n in names], "active": active}
        print_json({**listing, "note": damaged} if damaged else listing)
        return
    if not names:
        echo("no users yet; create one with `localpers user create NAME`", err=True)
    for name in names:
        echo(f"{'*' if name == active else ' '} {name}")
    if damaged:
        echo(f"note: no user is marked active: {one_line(damaged)}", err=True)


@user_app.command("use")
@one_line_errors
def user_use(
    name: Annotated[str, typer.Argument(help="An existing user.", autocompletion=completion.user_names)],
) -> None:
    """Make NAME the active user (the default for history, fit and rewrite)."""
    UserStore().use(name)
    echo(f"active user: {name}")


@user_app.command("show")
@one_line_errors
def user_show(
    name: Annotated[
        str | None,
        typer.Argument(help="A user (default: the active one).", autocompletion=completion.user_names),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Show a user's history size, cluster, fitted vector and fit report, and its CoPe and EXACT fits."""
    store = UserStore()
    user = store.resolve(name)
    state, vector = user.fit_files()
    history = user.history()
    report: dict[str, Any] = {
        "name": user.name,
        "active": _is_active(store, user.name),
        "dir": str(user.dir),
        "history_items": len(history),
        "tasks": dict(Counter(item.task for item in history)),
        "cluster": state.get("cluster"),
        "vector": None
        if vector is None
        else {
            "dim": int(vector.size),
            "sha256": state.get("vector_sha256"),
            "metadata": user.vector_metadata(state),
        },
        "state": state,
        "other_fits": dict(other_fits(user.dir, history)),
        "rejected_outputs": rejected_count(user),
        "disk_bytes": user.disk_bytes(),
    }
    if as_json:
        print_json(report)
        return
    tasks = ", ".join(f"{task}: {count}" for task, count in report["tasks"].items())
    echo(f"user        {user.name}{' (active)' if report['active'] else ''}")
    echo(f"folder      {user.dir}")
    echo(f"history     {items_phrase(len(history))}{f' ({tasks})' if tasks else ''}")
    echo(f"cluster     {cluster_text(report['cluster'], user.name)}")
    if vector is None:
        first = f"`localpers history import FILE --user {user.name}`, then " if not history else ""
        echo(f"vector      none (run {first}`localpers fit --user {user.name}`)")
    else:
        echo(f"vector      D={vector.size}, sha256 {str(state.get('vector_sha256'))[:16]}")
    imported = bool(state.get(IMPORTED_WITHOUT_HISTORY))
    freshness = fit_freshness(state.get("fit"), history, user.name, imported_without_history=imported)
    echo(f"fitted      {freshness}")
    for label, text in [*state_summary(state, user.name), *report["other_fits"].items()]:
        # escaped: an imported archive's state.json is kept as it is (a label or habit may hold terminal escapes)
        echo(f"{one_line(label):<11} {one_line(text)}")
    if report["rejected_outputs"]:
        echo(
            f"rejected    {counted(report['rejected_outputs'], 'output')} turned down in the TUI, kept with their"
            f" inputs in {user.rejected_path.name} for a later fit (none reads them yet); remove that file to forget"
            " them"
        )
    echo(f"disk        {report['disk_bytes']} bytes")


@user_app.command("delete")
@one_line_errors
def user_delete(
    name: Annotated[str, typer.Argument(help="The user to delete.", autocompletion=completion.user_names)],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete a user and every trace of it: history, vector, state and the active pointer."""
    store = UserStore()
    user = store.get(name)
    if not yes:
        try:
            contents = f"{items_phrase(len(user.history()))} of history"
        except LocalpersError:
            contents = "a damaged history"  # deleting must still work when the files are damaged
        question = f"Delete user {name!r} ({contents}, its vector and state)? This cannot be undone"
        if not ask_yes_no(question):
            raise LocalpersError(f"user {name!r} was not deleted")
    pointer_left = store.delete(name)
    echo(f"deleted user {name!r}")
    if pointer_left is not None:
        echo(f"note: {pointer_left}", err=True)


def _fit_as_a_rewrite_reads_it(with_history: bool = True) -> Callable[[User], None]:
    """The check `user import` and `user export` give the store: the user's fit read as a rewrite reads it, its
    cluster against the bundle in use where the fit was made for that bundle (an archive's state.json is outside
    input; an export the import refuses could only be refused again). `with_history`: the history is read too."""
    from localpers.bundle.format import bundle_in_use_sha256, default_bundle_dir, read_manifest
    from localpers.methods.card.user_state import check_stored_fit, head_dim_of

    in_use = bundle_in_use_sha256()
    try:  # the manifest alone (what `in_use` hashes): verifying every file only to count clusters is slow
        manifest = read_manifest(default_bundle_dir())
        clusters, head_d = (manifest.get("clusters") or {}).get("k"), head_dim_of(manifest)
    except LocalpersError:
        clusters, head_d = None, None
    if not isinstance(clusters, int) or isinstance(clusters, bool) or clusters < 1:
        clusters = None  # no readable bundle: the cluster is judged when a rewrite opens one

    def check(user: User) -> None:
        check_stored_fit(user, in_use, clusters, head_d, with_history=with_history)

    return check


def _export_destination(given: str | None) -> Path:
    """Where `user export -o` writes: a name ending in a slash must be an existing folder (a zip file was
    written under the folder's name)."""
    if given is None:
        return Path.cwd()
    path = Path(given)
    with contextlib.suppress(RuntimeError):  # `~` left by the shell (`--output=~/x.zip`); none without a home
        path = path.expanduser()
    if given.endswith(("/", os.sep)) and not path.is_dir():
        raise InputError(
            f"--output {given}: no such folder; create it first, or give the archive's file name"
        )
    return path


@user_app.command("export")
@one_line_errors
def user_export(
    name: Annotated[
        str | None,
        typer.Argument(
            help="The user to export (default: the active one).", autocompletion=completion.user_names
        ),
    ] = None,
    output: Annotated[
        str | None,  # not Path: it would drop the trailing slash that says a folder is meant
        typer.Option(
            "--output",
            "-o",
            metavar="PATH",
            help="Zip file or existing folder (default: ./localpers-user-NAME.zip).",
        ),
    ] = None,
    with_history: Annotated[
        bool, typer.Option("--with-history", help="Include the history (your own text); off by default.")
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Write a user's vector, cluster and state to one .zip; the history only with --with-history.

    Without the history the archive still says something of your writing: the state keeps the words you use most (as the backbone's token ids, which anyone with its tokenizer can read) and your habits (e.g. how your headlines open).

    CoPe's LoRA and EXACT's index are not in it (they are refitted from the history after an import)."""
    store = UserStore()
    user = store.resolve(name)
    # the history is checked by the export itself, and only where it goes in the archive
    check = _fit_as_a_rewrite_reads_it(with_history=False)
    dest = store.export(user.name, _export_destination(output), with_history, overwrite=force, check=check)
    left_out = [
        method for method, _ in other_fits(user.dir)
    ]  # CoPe's LoRA and EXACT's index are not archived
    # as the archive itself says; with --with-history a fit there fits the history (or its absence)
    kept_on_refit = None if with_history else archived_fit_kept_on_refit(dest)
    if as_json:
        print_json(
            {
                "user": user.name,
                "archive": str(dest),
                "with_history": with_history,
                "not_exported": left_out,
                "fit_kept_on_refit": kept_on_refit,
            }
        )
        return
    echo(f"exported user {user.name!r} to {dest}{' (with history)' if with_history else ''}")
    if not with_history and (left := _history_size(user)):
        echo(
            f"not exported: the history ({items_phrase(left)}); on the other device rewrites show none of its"
            " examples, where most of the personalization comes from (--with-history includes it)"
        )
    if kept_on_refit is False:
        echo(
            "the fit is not of the history as it is now (items were added or removed since it was made): on the"
            " other device rewrites use it, but `localpers fit` there has no items to fit and replaces it with"
            f" the global adapter's; `localpers fit --user {user.name}` here first and export again, or export"
            " --with-history"
        )
    if left_out:
        names = " and ".join({"cope": "CoPe's LoRA", "exact": "EXACT's index"}[method] for method in left_out)
        refits = " and ".join(refit_advice(method, user.name).removeprefix("run ") for method in left_out)
        echo(f"not exported: {names}; after importing, refit with {refits}")


def _history_size(user: User) -> int:
    """How many items the user's history holds; 0 where it cannot be read (the export itself needs none of it)."""
    try:
        return len(user.history())
    except LocalpersError:
        return 0


@user_app.command("import")
@one_line_errors
def user_import(
    archive: Annotated[Path, typer.Argument(help="A .zip written by `localpers user export`.")],
    new_name: Annotated[str | None, typer.Option("--as", help="Import under this name instead.")] = None,
    use: Annotated[
        bool | None,
        typer.Option(
            "--use/--no-use",
            help="Make the imported user active, or not; without either, it is made active when no user is.",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Create a user from an exported archive (checked before the user appears)."""
    store = UserStore()
    user = store.import_(archive, new_name, check=_fit_as_a_rewrite_reads_it(), activate=False)
    note_saved(f"user {user.name!r} was imported")
    not_activated = _activate(store, user.name, use)
    _say_made(user, "imported", store, not_activated, as_json)


def _activate(store: UserStore, name: str, use: bool | None) -> str | None:
    """Make the user just made active as asked (`use` None: only when no user is active); why it could not be, or
    None. The user is kept either way: failing the command would have a script that retries find it taken."""
    if use is None:
        try:
            use = store.active_name() is None
        except LocalpersError:  # a damaged pointer is left for `user use` to mend, not replaced unasked
            return None
    try:
        if use:
            store.use(name)
    except LocalpersError as exc:
        return f"user {name!r} was not made active: {one_line(str(exc))}; `localpers user use {name}` does it later"
    return None


def _say_made(user: User, made: str, store: UserStore, not_activated: str | None, as_json: bool) -> None:
    """Report a created or imported user: its folder, whether it is active, and why not where it was asked."""
    active = _is_active(store, user.name)
    if as_json:
        report: dict[str, Any] = {"name": user.name, "dir": str(user.dir), "active": active}
        if not_activated is not None:
            report["note"] = not_activated
        print_json(report)
        return
    echo(f"{made} user {user.name!r}{' (active)' if active else ''}")
    if not_activated is not None:
        echo(f"note: {not_activated}", err=True)


def _is_active(store: UserStore, name: str) -> bool:
    """Whether `name` is the active user, for display: a damaged active.json (which `user list` reports and `user
    use` repairs) made `user create` and `user import` exit 2 after making the user, and `user show NAME` refuse."""
    try:
        return store.active_name() == name
    except LocalpersError:
        return False
