"""`localpers profile`: the user's interpretable style profile (CARD's fit, the series they repeat, EXACT's attributes).

Reads the user's folder only; nothing here opens a network connection.
"""

from __future__ import annotations

import sys
import textwrap
from typing import Annotated, Any

import typer

from localpers.cli import completion
from localpers.cli.common import UserOption, print_json
from localpers.methods.stored_files import refit_advice
from localpers.untrusted import one_line
from localpers.users.store import UserStore


def profile_command(
    user: UserOption = None,
    text: Annotated[
        str | None,
        typer.Option("--text", help="Also show the attributes EXACT retrieves for this text (- = stdin)."),
    ] = None,
    task: Annotated[
        str,
        typer.Option(
            "--task",
            "-t",
            help="Task of --text: headline, title, paraphrase or free.",
            autocompletion=completion.task_names,
        ),
    ] = "headline",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")] = False,
) -> None:
    """Show the user's style profile: CARD's fit and habits, the series you repeat, EXACT's attributes."""
    from localpers.cli.common import read_text_argument
    from localpers.methods.profile import user_style_profile
    from localpers.tasks import get_task

    get_task(task)  # an unknown task is refused (exit 2), with or without --text
    target = UserStore().resolve(user)
    profile = user_style_profile(target, read_text_argument(text) if text is not None else None, task)
    if as_json:
        print_json(profile, indent=None)
        return
    _print_profile(profile, text is not None, has_history=bool(profile["history_items"]))


def _print_profile(profile: dict[str, Any], asked_for_text: bool, *, has_history: bool = True) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    console.width = max(console.width, 40)  # COLUMNS=0 or 1 would print nothing, or a character a line
    console.print(f"[bold]{profile['user']}[/bold]")
    card = profile["card"]
    refit = f"`localpers fit --user {profile['user']}`"
    # a fit learns from the history: with none, import it first (as `user show` advises)
    first = "" if has_history else f"`localpers history import FILE --user {profile['user']}`, then "
    if card is None:
        console.print(f"CARD: not fitted (run {first}{refit})")
    elif "damaged" in card:
        # soft_wrap: a path in the message is not broken mid-name, and can be copied
        console.print(one_line(f"CARD: {card['damaged']}"), markup=False, highlight=False, soft_wrap=True)
    elif card["cluster"] is None:
        console.print(f"CARD: fitted with no history (cold start); run {refit} again once you have some")
    else:
        console.print(  # a state.json from an imported archive, as it is: never markup or terminal controls
            one_line(
                f"CARD: cluster {card['cluster']} ({card['mode']}), similarities {card['cluster_similarities']}"
            ),
            markup=False,
            highlight=False,
        )
        if card.get("bundle_in_use") is False:
            _print_indented(
                console,
                "made with another bundle than the one in use (pulled or shipped since): rewrites show your"
                f" history without this correction until you run {refit}",
            )
        if card.get("outdated_format"):
            _print_indented(
                console,
                "made by a localpers of another fit format, whose fits this one does not read: rewrites show your"
                f" history without this correction until you run {refit}",
            )
        if card.get("choice"):
            choice = card["choice"]
            _print_indented(console, f"correction: {choice['label']}: {choice['reason']}")
        if card.get("habits"):
            _print_indented(console, "habits: " + "; ".join(card["habits"]))
    series = profile.get("series") or []
    if series:
        console.print("Series you repeat (shown to the model in full for a text about one):")
        for found in series:
            _print_indented(
                console, f"{found['size']} alike ({found['task']}), the latest: {found['latest']}"
            )
    else:
        console.print("Series you repeat: none (3 or more alike outputs make one)")
    exact = profile["exact"]
    if exact is None:
        exact_fit = refit_advice("exact", profile["user"]).removeprefix("run ")
        console.print(f"EXACT: no index (run {first}{exact_fit})")
        if asked_for_text:  # --text asked what EXACT retrieves: say why there is nothing, not drop it
            console.print("for this text: no attributes (EXACT has no index to retrieve them from)")
        sys.stdout.flush()
        return
    if "damaged" in exact:
        console.print(f"EXACT: {escape(one_line(exact['damaged']))}")
        if asked_for_text:
            console.print("for this text: no attributes (EXACT's index is damaged)")
        sys.stdout.flush()
        return
    table = Table(title=f"EXACT attributes over {exact['indexed_inputs']} indexed inputs (k={exact['k']})")
    table.add_column("attribute")
    table.add_column("inputs", justify="right")
    table.add_column("share", justify="right")
    for row in exact["frequencies"]:
        table.add_row(escape(row["attribute"]), str(row["count"]), f"{100 * row['share']:.0f}%")
    console.print(table)
    if asked_for_text:
        retrieved = exact["retrieved"]
        if retrieved["attributes"]:
            console.print(
                f"for this text: [bold]{escape(', '.join(retrieved['attributes']))}[/bold] (nearest history"
                f" input, cosine {retrieved['similarity']}: {escape(repr(retrieved['matched_input'][:80]))})"
            )  # the user's own text is never markup: `[/b]` in it is shown, not taken as a tag
        else:
            console.print("for this text: no attributes (the index is empty)")
    sys.stdout.flush()


def _print_indented(console: Any, line: str) -> None:
    """`line` two columns in, its wrapped rest too (not from column 0); the user's own text is never markup, and
    control characters in it are escaped (an imported state.json's habits or reasons could hold any)."""
    wrapped = textwrap.fill(
        one_line(line), width=max(console.width, 40), initial_indent="  ", subsequent_indent="  "
    )
    console.print(wrapped, markup=False, highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add `profile` to the main app with one-line error handling."""
    from localpers.cli.common import one_line_errors

    app.command("profile")(one_line_errors(profile_command))
