"""CLI for CoPe and EXACT: `localpers profile`, and the `--method cope|exact` branches of `fit` and `rewrite`.

`fit` and `rewrite` (in `cli_device`) hand these methods over to `fit_method` / `rewrite_method`
here; everything they store stays in the user's folder. Nothing here opens a network connection.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from localpers.decoding import SamplerSettings
from localpers.errors import LocalpersError
from localpers.personalize import Personalizer
from localpers.store import User, UserStore

EXTRA_METHODS = ("cope", "exact")


def fit_method(
    method: str,
    personalizer: Personalizer,
    user: User,
    *,
    history_limit: int | None,
    progress: Callable[[str, int, int], None] | None,
) -> dict[str, Any]:
    """Fit CoPe (train the user's LoRA) or EXACT (build the attribute index); returns the JSON report."""
    if method == "cope":
        from localpers.methods.cope import fit_cope, stored_bytes

        state = fit_cope(personalizer, user, history_limit=history_limit, progress=progress)
        return {"method": "cope", **state.to_json(), "stored_bytes": stored_bytes(user)}
    if method == "exact":
        from localpers.methods.exact import index_exact, index_path

        report = index_exact(personalizer, user, history_limit=history_limit, progress=progress)
        return {"method": "exact", **report.to_json(), "stored_bytes": index_path(user).stat().st_size}
    raise LocalpersError(f"unknown method {method!r}; choose one of: {', '.join(EXTRA_METHODS)}")


def fit_summary(user: str, report: dict[str, Any]) -> str:
    total = sum(report["seconds"].values())
    timing = ", ".join(f"{k} {v:.1f} s" for k, v in report["seconds"].items())
    if report["method"] == "cope":
        head = (
            f"user {user}: CoPe LoRA (rank {report['rank']}) on {report['base_adapter']}, {report['n_items']} items,"
            f" {report['steps']} steps, final loss {report['final_loss']}"
        )
    else:
        head = (
            f"user {user}: EXACT index of {report['n_indexed']} inputs from {report['n_pairs']} pairs"
            f" (cluster {report['cluster']}, k={report['k']}; {report['n_filtered_negative_gain']} pairs with"
            f" negative gain left out)"
        )
    return f"{head}\n{report['stored_bytes'] / 1e6:.2f} MB stored; fit took {total:.1f} s ({timing})"


def rewrite_method(
    method: str,
    personalizer: Personalizer,
    user: User,
    text: str,
    *,
    task: str,
    strength: float | None,
    max_tokens: int | None,
    on_text: Callable[[str], None] | None,
    sampling: SamplerSettings | None = None,
) -> dict[str, Any]:
    """Rewrite `text` with CoPe (strength = its contrastive alpha) or EXACT; returns the JSON payload."""
    if method == "cope":
        from localpers.methods.cope import DEFAULT_ALPHA, CopeDecoder, load_state, rewrite_cope

        state = load_state(user)
        decoder = CopeDecoder.for_user(personalizer, user, state)
        try:
            alpha = DEFAULT_ALPHA if strength is None else strength
            result = rewrite_cope(
                decoder,
                state,
                text,
                task=task,
                alpha=alpha,
                max_tokens=max_tokens,
                on_text=on_text,
                sampling=sampling,
            )
        finally:
            decoder.close()
        return {"user": user.name, **result.to_json()}
    if method == "exact":
        from localpers.methods.exact import check_bundle, load_index, rewrite_exact

        index = load_index(user)
        check_bundle(index, personalizer, user.name)
        result, retrieval = rewrite_exact(
            personalizer, index, text, task=task, max_tokens=max_tokens, on_text=on_text, sampling=sampling
        )
        return {"user": user.name, **result.to_json(), "attributes": retrieval.to_json()}
    raise LocalpersError(f"unknown method {method!r}; choose one of: {', '.join(EXTRA_METHODS)}")


def profile_command(
    user: Annotated[
        str | None, typer.Option("--user", "-u", help="User name (default: the active user).")
    ] = None,
    text: Annotated[
        str | None,
        typer.Option("--text", help="Also show the attributes EXACT retrieves for this text (- = stdin)."),
    ] = None,
    task: Annotated[str, typer.Option("--task", "-t", help="Task of --text.")] = "headline",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")] = False,
) -> None:
    """Show the user's style profile: EXACT attribute frequencies, attributes for a text, CARD's cluster."""
    from localpers.cli import read_text_argument
    from localpers.methods.profile import user_style_profile

    target = UserStore().resolve(user)
    profile = user_style_profile(target, read_text_argument(text) if text is not None else None, task)
    if as_json:
        typer.echo(json.dumps(profile, ensure_ascii=False))
        return
    _print_profile(profile, text is not None)


def _print_profile(profile: dict[str, Any], asked_for_text: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[bold]{profile['user']}[/bold]")
    card = profile["card"]
    if card is None:
        console.print("CARD: not fitted (run `localpers fit`)")
    else:
        console.print(
            f"CARD: cluster {card['cluster']} ({card['mode']}), similarities {card['cluster_similarities']}"
        )
    exact = profile["exact"]
    if exact is None:
        console.print("EXACT: no index (run `localpers fit --method exact`)")
        return
    table = Table(title=f"EXACT attributes over {exact['indexed_inputs']} indexed inputs (k={exact['k']})")
    table.add_column("attribute")
    table.add_column("inputs", justify="right")
    table.add_column("share", justify="right")
    for row in exact["frequencies"]:
        table.add_row(row["attribute"], str(row["count"]), f"{100 * row['share']:.0f}%")
    console.print(table)
    if asked_for_text:
        retrieved = exact["retrieved"]
        if retrieved["attributes"]:
            console.print(
                f"for this text: [bold]{', '.join(retrieved['attributes'])}[/bold]"
                f" (nearest history input, cosine {retrieved['similarity']}: {retrieved['matched_input'][:80]!r})"
            )
        else:
            console.print("for this text: no attributes (the index is empty)")
    sys.stdout.flush()


def register(app: typer.Typer) -> None:
    """Add `profile` to the main app with one-line error handling."""
    from localpers.cli import one_line_errors

    app.command("profile")(one_line_errors(profile_command))
