"""CLI commands of the device side of CARD: `fit`, `rewrite` and `demo`.

They load one `Personalizer` (backbone + bundle) per invocation and read/write users through the
store. User text stays in the user's folder; nothing here opens a network connection.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer

from localpers.choice import stored_choice
from localpers.cli_methods import EXTRA_METHODS, fit_method, fit_summary, rewrite_method
from localpers.cli_sampling import (
    PANEL,
    FrequencyPenaltyOption,
    GrammarOption,
    MinPOption,
    PresencePenaltyOption,
    RepetitionPenaltyOption,
    SeedOption,
    TemperatureOption,
    TopPOption,
    sampler_settings,
)
from localpers.errors import LocalpersError
from localpers.personalize import METHODS, FitReport, Personalizer, RewriteResult, user_profile
from localpers.store import User, UserStore
from localpers.tasks import get_task
from localpers.token_bias import TokenBias

DEMO_USER = "demo"

UserOption = Annotated[str | None, typer.Option("--user", "-u", help="User name (default: the active user).")]
BundleOption = Annotated[
    str | None,
    typer.Option("--bundle", help="Bundle directory (default: the pulled bundle, else the demo bundle)."),
]
ModelOption = Annotated[
    str | None,
    typer.Option("--model", envvar="LOCALPERS_MODEL", help="Backbone GGUF path (default: embedded)."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]


@contextmanager
def fit_progress(enabled: bool) -> Iterator[Any]:
    """A rich progress bar fed by the Personalizer's (stage, done, total) callback."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    labels = {
        "negatives": "model's own outputs (y-)",
        "features": "pair features",
        "pairs": "pairs (y- + features)",
    }
    with Progress(
        TextColumn("{task.description:<26}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        transient=True,
    ) as progress:
        tasks: dict[str, Any] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = progress.add_task(labels.get(stage, stage), total=total)
            progress.update(tasks[stage], completed=done)

        yield update


def _fit_summary(user: str, report: FitReport, choice: dict[str, Any] | None = None) -> str:
    if report.mode == "cold-start":
        return f"{user}: no history yet, so rewrites use the global adapter. Add items with `localpers history import`."
    lines = [f"user {user}: cluster {report.cluster} (similarities {report.cluster_similarities})"]
    if report.mode == "too-few-pairs":
        lines.append(
            f"only {report.n_pairs} usable pairs: no personal vector yet, rewrites use cluster {report.cluster}'s "
            "adapter without a correction; add history and refit"
        )
    else:
        heldout = (
            f"held-out pair accuracy {report.heldout_accuracy:.2f} on {report.n_heldout} pairs"
            f" (cluster default {report.heldout_accuracy_default:.2f})"
            if report.heldout_accuracy is not None
            else "too few pairs for a held-out split"
        )
        lines.append(f"{report.n_pairs} pairs, training pair accuracy {report.train_accuracy:.2f}, {heldout}")
    if report.mode == "vector":
        if choice:
            lines.append(f"chose {choice['label']}: {choice['reason']}")
        else:
            lines.append(
                "too few items to choose a correction on your own recent items: the bundle's defaults apply"
            )
    total = sum(report.seconds.values())
    lines.append(f"fit took {total:.1f} s ({', '.join(f'{k} {v:.1f} s' for k, v in report.seconds.items())})")
    return "\n".join(lines)


def fit_command(
    user: UserOption = None,
    method: Annotated[
        str,
        typer.Option(
            "--method", "-m", help="card (default), cope (train a user LoRA) or exact (attribute index)."
        ),
    ] = "card",
    history_limit: Annotated[
        int | None, typer.Option(min=1, help="Use only the N most recent items.")
    ] = None,
    bundle: BundleOption = None,
    model: ModelOption = None,
    as_json: JsonOption = False,
) -> None:
    """Fit the user from their history: CARD's cluster and vector, or CoPe/EXACT with --method (all on this machine)."""
    if method not in ("card", *EXTRA_METHODS):
        raise LocalpersError(f"unknown method {method!r}; choose one of: card, {', '.join(EXTRA_METHODS)}")
    target = UserStore().resolve(user)
    personalizer = Personalizer.open(model=model, bundle=bundle)
    if method in EXTRA_METHODS:
        with fit_progress(not as_json and sys.stderr.isatty()) as progress:
            extra = fit_method(method, personalizer, target, history_limit=history_limit, progress=progress)
        typer.echo(json.dumps({"user": target.name, **extra}) if as_json else fit_summary(target.name, extra))
        return
    with fit_progress(not as_json and sys.stderr.isatty()) as progress:
        report = personalizer.fit_user(target, progress=progress, history_limit=history_limit)
    choice = target.state().get("choice")
    if as_json:
        typer.echo(json.dumps({"user": target.name, **report.to_json(), "choice": choice}))
    else:
        typer.echo(_fit_summary(target.name, report, choice))


def _profile_for_rewrite(
    target: User | None, method: str, personalizer: Personalizer
) -> tuple[int | None, Any, TokenBias | None, dict[str, Any]]:
    """The user's cluster, vector, token bias and state, refusing stale or missing fits for personalized methods."""
    if target is None or method == "global":
        return None, None, None, {}
    cluster, vector, state = user_profile(target)
    if not state.get("fit"):
        raise LocalpersError(
            f"user {target.name!r} has not been fitted: run `localpers fit --user {target.name}`"
        )
    if state.get("bundle_sha256") != personalizer.bundle_sha256:
        raise LocalpersError(
            f"user {target.name!r} was fitted with another bundle: run `localpers fit --user {target.name}` again"
        )
    return cluster, vector, target.token_bias(state), state


def rewrite_command(
    text: Annotated[str, typer.Argument(help="Input text, or - to read standard input.")],
    user: UserOption = None,
    task: Annotated[
        str, typer.Option("--task", "-t", help="headline, title, paraphrase or free.")
    ] = "headline",
    method: Annotated[
        str, typer.Option("--method", "-m", help=f"One of: {', '.join((*METHODS, *EXTRA_METHODS))}.")
    ] = "card",
    strength: Annotated[
        float | None,
        typer.Option(
            min=0.0, help="CARD strength α (default: the bundle's); for cope, its contrastive α (0.3)."
        ),
    ] = None,
    top_k: Annotated[int | None, typer.Option(min=1, help="Correct only the k best cluster tokens.")] = None,
    max_tokens: Annotated[
        int | None, typer.Option(min=1, max=2048, help="Token limit (default: the task's).")
    ] = None,
    stream: Annotated[bool, typer.Option("--stream/--no-stream", help="Print tokens as they come.")] = True,
    temperature: TemperatureOption = 0.0,
    sample_top_k: Annotated[
        int,
        typer.Option(
            "--sample-top-k", min=0, help="Keep the k most likely tokens (0 = all).", rich_help_panel=PANEL
        ),
    ] = 0,
    top_p: TopPOption = 1.0,
    min_p: MinPOption = 0.0,
    repetition_penalty: RepetitionPenaltyOption = 1.0,
    presence_penalty: PresencePenaltyOption = 0.0,
    frequency_penalty: FrequencyPenaltyOption = 0.0,
    seed: SeedOption = None,
    grammar: GrammarOption = None,
    bundle: BundleOption = None,
    model: ModelOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write TEXT's headline/title/paraphrase the way the user writes (CARD by default)."""
    from localpers.cli import read_text_argument

    source = read_text_argument(text)
    sampling = sampler_settings(
        temperature=temperature,
        top_k=sample_top_k,
        top_p=top_p,
        min_p=min_p,
        repetition_penalty=repetition_penalty,
        presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
        seed=seed,
        grammar=grammar,
    )
    store = UserStore()
    target = store.resolve(user) if (user or store.active_name() or method != "global") else None
    personalizer = Personalizer.open(model=model, bundle=bundle)

    def stream_piece(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    if method in EXTRA_METHODS:
        payload = rewrite_method(
            method,
            personalizer,
            target,
            source,
            task=task,
            strength=strength,
            max_tokens=max_tokens,
            on_text=stream_piece if (stream and not as_json) else None,
            sampling=sampling,
        )
        if as_json:
            typer.echo(json.dumps(payload, ensure_ascii=False))
        else:
            typer.echo("" if stream else payload["text"])
        return
    cluster, vector, bias, state = _profile_for_rewrite(target, method, personalizer)
    chosen_strength, chosen_bias, _ = stored_choice(state) if method == "card" else (None, None, None)
    if strength is None:
        strength = chosen_strength
    if method != "global" and cluster is None:
        if not as_json:
            typer.echo("note: this user has no history yet; using the global adapter", err=True)
        method = "global"

    result = personalizer.rewrite(
        source,
        task=task,
        method=method,
        cluster=cluster,
        vector=vector,
        strength=strength,
        top_k=top_k,
        max_tokens=max_tokens,
        sampling=sampling,
        on_text=stream_piece if (stream and not as_json) else None,
        history=target.history_index(get_task(task)) if target is not None else None,
        bias=bias,
        bias_strength=chosen_bias,
    )
    if as_json:
        typer.echo(
            json.dumps({"user": target.name if target else None, **result.to_json()}, ensure_ascii=False)
        )
    elif stream:
        sys.stdout.write("\n")
    else:
        typer.echo(result.text)


def ensure_demo_user(personalizer: Personalizer, store: UserStore, progress: Any = None) -> tuple[User, bool]:
    """The demo user, created from the shipped history and fitted when missing or stale."""
    from localpers.history import demo_history_path, parse_history_file

    demo = store.get(DEMO_USER) if DEMO_USER in store.list() else store.create(DEMO_USER)
    if not demo.history():
        demo.save_history(parse_history_file(demo_history_path()))
    state = demo.state()
    fitted_now = False
    if not state.get("fit") or state.get("bundle_sha256") != personalizer.bundle_sha256:
        personalizer.fit_user(demo, progress=progress)
        fitted_now = True
    return demo, fitted_now


def demo_articles() -> list[str]:
    """Inputs of the shipped demo articles (invented text, see models/demo-user/README.md)."""
    from localpers.history import demo_history_path

    path = demo_history_path().with_name("articles.jsonl")
    return [json.loads(line)["input"] for line in path.read_text().splitlines() if line.strip()]


def demo_command(
    articles: Annotated[int, typer.Option(min=1, max=4, help="How many demo articles to show.")] = 3,
    bundle: BundleOption = None,
    model: ModelOption = None,
    as_json: JsonOption = False,
) -> None:
    """Fit the shipped demo user (first run) and compare global, cluster and personalized headlines."""
    personalizer = Personalizer.open(model=model, bundle=bundle)
    store = UserStore()
    if not as_json:
        typer.echo(
            f"bundle {personalizer.bundle.directory} (k={personalizer.bundle.k}); backbone {personalizer.backbone.path.name}"
        )
    with fit_progress(not as_json and sys.stderr.isatty()) as progress:
        demo, fitted_now = ensure_demo_user(personalizer, store, progress)
    report = demo.state()["fit"]
    cluster, vector, state = user_profile(demo)
    history = demo.history_index(get_task("headline"))
    chosen_strength, chosen_bias, _ = stored_choice(state)
    rows: list[dict[str, Any]] = []
    for article in demo_articles()[:articles]:
        outputs: dict[str, RewriteResult] = {
            method: personalizer.rewrite(
                article,
                method=method,
                cluster=cluster,
                vector=vector,
                history=history,
                bias=demo.token_bias(state),
                strength=chosen_strength,
                bias_strength=chosen_bias,
            )
            for method in ("global", "cluster", "card")
        }
        rows.append({"article": article.split(":", 1)[-1].strip(), **{m: r.text for m, r in outputs.items()}})
    hits = {m: sum(carries_demo_style(row[m]) for row in rows) for m in ("global", "cluster", "card")}
    if as_json:
        payload = {
            "user": DEMO_USER,
            "fitted_now": fitted_now,
            "fit": report,
            "rows": rows,
            "style_hits": hits,
        }
        typer.echo(json.dumps(payload, ensure_ascii=False))
        return
    if fitted_now:
        typer.echo(_fit_summary(DEMO_USER, FitReport(**report), demo.state().get("choice")))
    _print_comparison(rows)
    typer.echo(
        "the demo user's markers (a short kicker before a colon, or \"Here's Why\"; all 24 history items have "
        f"one): global {hits['global']}/{len(rows)}, cluster adapter {hits['cluster']}/{len(rows)}, "
        f"CARD {hits['card']}/{len(rows)}"
    )


_DEMO_KICKER = re.compile(r"^[^:]{2,40}: \S")


def carries_demo_style(text: str) -> bool:
    """Whether a headline shows the demo user's habit: a short kicker before a colon, or "Here's Why"."""
    return bool(_DEMO_KICKER.match(text)) or "here's why" in text.lower().replace("\u2019", "'")


def _print_comparison(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Demo user (a punny optimist): one article per row", show_lines=True)
    table.add_column("article", ratio=3)
    table.add_column("global (non-personalized)", ratio=2)
    table.add_column("cluster adapter", ratio=2)
    table.add_column("CARD (personalized)", ratio=2, style="bold")
    for row in rows:
        table.add_row(row["article"], row["global"], row["cluster"], row["card"])
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Add fit, rewrite and demo to the main app, each with one-line error handling."""
    from localpers.cli import one_line_errors

    app.command("fit")(one_line_errors(fit_command))
    app.command("rewrite")(one_line_errors(rewrite_command))
    app.command("demo")(one_line_errors(demo_command))
