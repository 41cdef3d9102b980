"""The `localpers user ...` commands: create, list, use, show, delete, export and import this device's users.

Commands stay thin: `localpers.users.store` does the work; `show` only words what state.json holds. Nothing
here fits vectors. The `history` commands are in `localpers.cli.history`.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer

from localpers.cli import completion
from localpers.cli.common import JsonOption, counted, items_phrase, note_saved, one_line_errors, print_json
from localpers.errors import LocalpersError
from localpers.methods.stored_files import COPE_STATE_FILE, EXACT_INDEX_FILE, fit_is_outdated, refit_advice
from localpers.regular_files import read_regular_file
from localpers.untrusted import one_line, parse_json
from localpers.users.history import MAX_HISTORY_FILE_BYTES, HistoryItem, history_digest
from localpers.users.store import User, UserStore

user_app = typer.Typer(
    help="Create, choose, inspect, export and delete the users on this device.", no_args_is_help=True
)


# ---------------------------------------------------------------- user


@user_app.command("create")
@one_line_errors
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
        print_json({"name": user.name, "dir": str(user.dir), "active": active})
        return
    typer.echo(f"created user {name!r}{' (active)' if active else ''}")
    typer.echo("next: `localpers history import FILE` or `localpers history add --input ... --output ...`")


@user_app.command("list")
@one_line_errors
def user_list(as_json: JsonOption = False) -> None:
    """List the users; the active one is marked with *."""
    store = UserStore()
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
        typer.echo("no users yet; create one with `localpers user create NAME`", err=True)
    for name in names:
        typer.echo(f"{'*' if name == active else ' '} {name}")
    if damaged:
        typer.echo(f"note: no user is marked active: {one_line(damaged)}", err=True)


@user_app.command("use")
@one_line_errors
def user_use(
    name: Annotated[str, typer.Argument(help="An existing user.", autocompletion=completion.user_names)],
) -> None:
    """Make NAME the active user (the default for history, fit and rewrite)."""
    UserStore().use(name)
    typer.echo(f"active user: {name}")


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
            "metadata": user.vector_metadata(state),
        },
        "state": state,
        "other_fits": dict(_other_fits(user.dir)),
        "rejected_outputs": _rejected_count(user),
        "disk_bytes": user.disk_bytes(),
    }
    if as_json:
        print_json(report)
        return
    tasks = ", ".join(f"{task}: {count}" for task, count in report["tasks"].items())
    typer.echo(f"user        {user.name}{' (active)' if report['active'] else ''}")
    typer.echo(f"folder      {user.dir}")
    typer.echo(f"history     {items_phrase(len(history))}{f' ({tasks})' if tasks else ''}")
    typer.echo(f"cluster     {_cluster_text(report['cluster'], user.name)}")
    if vector is None:
        first = f"`localpers history import FILE --user {user.name}`, then " if not history else ""
        typer.echo(f"vector      none (run {first}`localpers fit --user {user.name}`)")
    else:
        typer.echo(f"vector      D={vector.size}, sha256 {str(state.get('vector_sha256'))[:16]}")
    typer.echo(f"fitted      {_fit_freshness(state.get('fit'), history, user.name)}")
    for label, text in [*_state_summary(state, user.name), *report["other_fits"].items()]:
        typer.echo(f"{label:<11} {text}")
    if report["rejected_outputs"]:
        typer.echo(
            f"rejected    {counted(report['rejected_outputs'], 'output')} turned down in the TUI, kept with their"
            f" inputs in {user.rejected_path.name} for a later fit (none reads them yet); remove that file to forget"
            " them"
        )
    typer.echo(f"disk        {report['disk_bytes']} bytes")


def _rejected_count(user: User) -> int:
    """How many outputs the user rejected in the TUI (lines of its file; 0 when absent or unreadable)."""
    if not user.rejected_path.exists():
        return 0
    try:
        raw = read_regular_file(
            user.rejected_path, MAX_HISTORY_FILE_BYTES, what="rejected outputs", stored=True
        )
    except LocalpersError:
        return 0
    return sum(1 for line in raw.split(b"\n") if line.strip())


# state.json keys that the lines above show, or that only the files' bookkeeping needs.
_SHOWN_STATE_KEYS = frozenset({"cluster", "vector_file", "vector_sha256", "vector_dim"})
_SUMMARISED_STATE_KEYS = frozenset(
    {"fit", "choice", "token_bias", "bundle_sha256", "created_at", "updated_at"}
)
_LONGEST_OTHER_VALUE = 100


def _state_summary(state: dict[str, Any], name: str) -> list[tuple[str, str]]:
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
    if bias is not None:
        from localpers.methods.card.token_bias import TokenBias

        try:
            TokenBias.from_json(bias)  # as a rewrite reads it
            lines.append(("token bias", _token_bias_line(bias)))
        except ValueError as exc:
            damaged = f"damaged ({one_line(str(exc), 120)}): rewrites refuse this fit; run `localpers fit --user {name}`"
            lines.append(("token bias", damaged))
    if isinstance(state.get("bundle_sha256"), str):
        lines.append(("bundle", _fit_bundle_line(state["bundle_sha256"], name)))
    if fit_is_outdated(state):
        lines.append(
            (
                "refit due",
                "made by a localpers of another fit format (see fitted_by), whose fits this one does not read:"
                f" rewrites show your history without CARD's correction until `localpers fit --user {name}`",
            )
        )
    for key in ("created_at", "updated_at"):
        if isinstance(state.get(key), str):
            # escaped: an imported archive's state.json is kept as it is
            lines.append((key.replace("_at", ""), one_line(state[key], 64)))
    for key, value in state.items():
        if key not in _SHOWN_STATE_KEYS | _SUMMARISED_STATE_KEYS:
            text = one_line(
                json.dumps(value, ensure_ascii=False)
            )  # C1 controls (U+009B: CSI) pass json.dumps
            if len(text) > _LONGEST_OTHER_VALUE:
                text = text[: _LONGEST_OTHER_VALUE - 1] + "…"
            lines.append((key, text))
    return lines


def _cluster_text(cluster: Any, name: str) -> str:
    """The stored cluster as `user show` prints it; one that is not a cluster number is named as rewrites name it
    (they refuse the fit), not shown as if it were one."""
    if cluster is None:
        return "not assigned"
    if isinstance(cluster, int) and not isinstance(cluster, bool) and cluster >= 0:
        return str(cluster)
    return (
        f"{one_line(repr(cluster), 40)}, not a cluster number (state.json is damaged): rewrites refuse this fit;"
        f" run `localpers fit --user {name}`"
    )


def _other_fits(folder: Path) -> list[tuple[str, str]]:
    """CoPe's and EXACT's fits, which live in files of their own: whether rewrites can use them, or are refused."""
    lines: list[tuple[str, str]] = []
    cope_state = folder / COPE_STATE_FILE
    if cope_state.is_file():
        try:
            cope = parse_json(cope_state.read_bytes())
            line = f"LoRA rank {int(cope['rank'])} fitted on {items_phrase(int(cope['n_items']))}"
            lines.append(("cope", line + _refit_due(cope, "cope", folder.name)))
        except (OSError, ValueError, TypeError, KeyError, ArithmeticError):  # JSONProblem is a ValueError
            lines.append(("cope", f"{cope_state.name} is damaged; {refit_advice('cope', folder.name)}"))
    if (folder / EXACT_INDEX_FILE).is_file():
        from localpers.methods.exact_index import ExactIndex

        try:
            meta = ExactIndex.load(folder / EXACT_INDEX_FILE, folder.name).meta
        except LocalpersError as exc:
            lines.append(("exact", one_line(str(exc))))
        else:
            line = "attribute index stored (`localpers profile` shows it)"
            lines.append(("exact", line + _refit_due(meta, "exact", folder.name)))
    return lines


def _refit_due(stored: dict[str, Any], method: str, name: str) -> str:
    """'' or why `rewrite --method METHOD` refuses a stored CoPe fit or EXACT index (`stored`: cope.json, the
    index's meta), and what mends it."""
    from localpers.bundle.format import bundle_in_use_sha256

    if fit_is_outdated(stored):
        why = "made by a localpers of another fit format"
    elif (in_use := bundle_in_use_sha256()) is not None and stored.get("bundle_sha256") != in_use:
        why = "made with another bundle than the one in use"
    else:
        return ""
    return f"; {why}: refit due, {refit_advice(method, name)}"


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


def _fit_freshness(fit: Any, history: list[HistoryItem], name: str) -> str:
    """Whether the stored fit saw the history as it is now: the digest of its items' ids the fit recorded, or
    (a fit made before it recorded one) the item counts. `--history-limit` fits fewer items than it holds."""
    n_history = len(history)
    refit = f"`localpers fit --user {name}`"
    if not isinstance(fit, dict) and n_history == 0:
        return "no (no history yet)"
    if not isinstance(fit, dict):
        return f"no (rewrites show your history without CARD's correction until {refit})"
    fitted_on = fit.get("n_items")
    if not isinstance(fitted_on, int) or isinstance(fitted_on, bool):
        return f"on an unknown number of items (state.json's fit.n_items is damaged; {refit} refits)"
    digest = fit.get("history_sha256")
    if n_history == 0 and fitted_on:  # e.g. imported from an export made without --with-history
        return (
            f"on {items_phrase(fitted_on)}, but the history holds none now (add it: `localpers history import"
            f" FILE --user {name}`; an export made with --with-history carries it)"
        )
    if isinstance(digest, str):
        if digest != history_digest(history):
            return (
                f"on {items_phrase(fitted_on)}, but the history has changed since (it holds {n_history} now;"
                f" {refit} refits)"
            )
        if fitted_on == n_history:
            return f"on the {items_phrase(n_history)} the history holds"
        return f"on {fitted_on} of the {items_phrase(n_history)} the history holds (unchanged since the fit)"
    if fitted_on == n_history:  # an older localpers recorded no digest: the same count may hide other items
        return (
            f"on {items_phrase(n_history)}, as many as the history holds (an earlier localpers did not record"
            f" which: if you removed or replaced items since, {refit} refits)"
        )
    return f"on {items_phrase(int(fitted_on or 0))}; the history holds {n_history} now ({refit} refits)"


def _fit_bundle_line(fitted_with: str, name: str) -> str:
    """The bundle the fit was made with, and whether it is the one rewrites use (read without a model load)."""
    from localpers.bundle.format import bundle_in_use_sha256

    shown = f"sha256 {fitted_with[:16]}"
    in_use = bundle_in_use_sha256()
    if in_use is None:
        return f"{shown} (the bundle the fit was made with)"
    if in_use == fitted_with:
        return f"{shown} (the bundle in use)"
    return (
        f"{shown}, not the bundle in use ({in_use[:16]}, pulled or shipped since): rewrites show your history"
        f" without CARD's correction until `localpers fit --user {name}`"
    )


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
        typer.confirm(
            f"Delete user {name!r} ({contents}, its vector and state)? This cannot be undone", abort=True
        )
    store.delete(name)
    typer.echo(f"deleted user {name!r}")


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
    """Write a user's vector, cluster and state to one .zip; the history only with --with-history.

    Without the history the archive still says something of your writing: the state keeps the words you use most (as the backbone's token ids, which anyone with its tokenizer can read) and your habits (e.g. how your headlines open).

    CoPe's LoRA and EXACT's index are not in it (they are refitted from the history after an import)."""
    store = UserStore()
    user = store.resolve(name)
    dest = store.export(
        user.name, output if output is not None else Path.cwd(), with_history, overwrite=force
    )
    left_out = [
        method for method, _ in _other_fits(user.dir)
    ]  # CoPe's LoRA and EXACT's index are not archived
    if as_json:
        print_json(
            {"user": user.name, "archive": str(dest), "with_history": with_history, "not_exported": left_out}
        )
        return
    typer.echo(f"exported user {user.name!r} to {dest}{' (with history)' if with_history else ''}")
    if not with_history and (left := _history_size(user)):
        typer.echo(
            f"not exported: the history ({items_phrase(left)}); on the other device rewrites show none of its"
            " examples, where most of the personalization comes from (--with-history includes it)"
        )
    if left_out:
        names = " and ".join({"cope": "CoPe's LoRA", "exact": "EXACT's index"}[method] for method in left_out)
        refits = " and ".join(refit_advice(method, user.name).removeprefix("run ") for method in left_out)
        typer.echo(f"not exported: {names}; after importing, refit with {refits}")


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
    use: Annotated[bool, typer.Option("--use/--no-use", help="Make the imported user active.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Create a user from an exported archive (checked before the user appears)."""
    store = UserStore()
    user = store.import_(archive, new_name)
    if use:
        store.use(user.name)
    note_saved(f"user {user.name!r} was imported{' and made active' if use else ''}")
    active = store.active_name() == user.name
    if as_json:
        print_json({"name": user.name, "dir": str(user.dir), "active": active})
        return
    typer.echo(f"imported user {user.name!r}{' (active)' if active else ''}")
