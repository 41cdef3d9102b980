"""The `localpers demo` command: the shipped demo user fitted on first run, its headlines beside the baselines'.

What the demo does (the user, the articles, the style count) is `localpers.device.demo`'s; this module parses the
options and prints the table and the counts.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from localpers.cli.common import BundleOption, JsonOption, ModelOption, counted, echo, print_json
from localpers.cli.progress import fit_progress
from localpers.errors import InputError
from localpers.methods.consensus import MAX_CANDIDATES
from localpers.methods.registry import BASELINE_METHOD, DEFAULT_METHOD, listed


def demo_command(
    articles: Annotated[
        int | None,
        typer.Option(
            min=1, help="How many of the shipped demo articles to rewrite and count (default: all)."
        ),
    ] = None,
    rows_shown: Annotated[
        int, typer.Option("--rows", min=0, help="How many of them to show in the table.")
    ] = 3,
    candidates: Annotated[
        int,
        typer.Option(
            min=1,
            max=MAX_CANDIDATES,
            help="Every method keeps the consensus of N candidates, as `rewrite --candidates N` (slower).",
        ),
    ] = 1,
    bundle: BundleOption = None,
    model: ModelOption = None,
    as_json: JsonOption = False,
) -> None:
    """Fit the shipped demo user (first run), compare its headlines with the baselines' and count its style."""
    from localpers.device.demo import (
        DEMO_USER,
        carries_demo_style,
        compare_on_demo,
        demo_articles,
        demo_methods,
        ensure_demo_user,
        style_hits,
    )
    from localpers.methods.card.method import fit_summary as card_fit_summary
    from localpers.methods.card.personalizer import Personalizer
    from localpers.methods.reports import FitReport
    from localpers.users.store import UserStore

    available = demo_articles()
    if articles is not None and articles > len(available):
        raise InputError(f"--articles: {len(available)} demo articles ship with localpers, not {articles}")
    chosen = available[: articles or len(available)]
    personalizer = Personalizer.open(model=model, bundle=bundle)
    store = UserStore()
    if not as_json:
        echo(
            f"bundle {personalizer.bundle.directory} (k={personalizer.bundle.k}); backbone {personalizer.backbone.path.name}"
        )
    with fit_progress(not as_json, sys.stderr.isatty(), command="demo") as progress:
        demo, fitted_now = ensure_demo_user(personalizer, store, progress, _note_restored)
        rows = compare_on_demo(personalizer, demo, chosen, progress, candidates)
    report = demo.state()["fit"]
    hits = style_hits(rows)
    if as_json:
        payload = {
            "user": DEMO_USER,
            "fitted_now": fitted_now,
            "fit": report,
            "rows": rows,
            "style_hits": hits,
            "candidates": candidates,
        }
        print_json(payload, indent=None)
        return
    if fitted_now:
        echo(card_fit_summary(DEMO_USER, FitReport(**report), demo.state().get("choice")))
    if rows_shown:
        _print_comparison(rows[:rows_shown], len(rows))
    counts = ", ".join(f"{listed(m).label} {hits[m]}/{len(rows)}" for m in demo_methods())
    history = [
        item.output for item in demo.history()
    ]  # 24 as shipped, all marked; the TUI may have added some
    marked = sum(map(carries_demo_style, history))
    which = f"all {len(history)}" if marked == len(history) else f"{marked} of its {len(history)}"
    echo(
        f"the demo user's markers (a short kicker before a colon, or \"Here's Why\"; {which} history items have one) "
        f"in the headlines of {counted(len(rows), 'invented article')}"
        + (f", each the consensus of {candidates} candidates" if candidates > 1 else "")
        + f": {counts}"
    )


def _note_restored(count: int) -> None:
    """Say that the demo put back shipped items missing from the demo user's history (a `history remove` of them
    was undone, or a damaged line's item mended)."""
    were = "was" if count == 1 else "were"
    echo(
        f"note: put back {counted(count, 'shipped example')} that {were} missing from the demo user's history"
        " (the demo shows the shipped user)",
        err=True,
    )


def _column_title(method: str) -> str:
    """`global (non-personalized)`, `adapter with your history`, `CARD (personalized)`: the demo table's headers."""
    label = listed(method).label
    if method == BASELINE_METHOD:
        return f"{label} (non-personalized)"
    return f"{label} (personalized)" if method == DEFAULT_METHOD else label


def _print_comparison(rows: list[dict[str, Any]], counted: int) -> None:
    from rich.console import Console
    from rich.table import Table

    from localpers.device.demo import demo_methods

    title = f"Demo user (a punny optimist): {len(rows)} of the {counted} articles, one per row"
    table = Table(title=title, show_lines=True)
    table.add_column("article", ratio=3)
    for method in demo_methods():
        table.add_column(_column_title(method), ratio=2, style="bold" if method == DEFAULT_METHOD else None)
    for row in rows:
        table.add_row(row["article"], *(row[method] for method in demo_methods()))
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Add demo to the main app, with one-line error handling."""
    from localpers.cli.common import one_line_errors

    app.command("demo")(one_line_errors(demo_command))
