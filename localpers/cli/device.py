"""CLI commands of the device side of CARD: `fit`, `rewrite` and `demo`.

They load one `Personalizer` (backbone + bundle) per invocation and read/write users through the
store. User text stays in the user's folder; nothing here opens a network connection.
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer

from localpers.cli.common import BundleOption, JsonOption, ModelOption, UserOption, counted, print_json
from localpers.cli.numbers import float_option
from localpers.cli.sampling import (
    FrequencyPenaltyOption,
    GrammarOption,
    MinPOption,
    PresencePenaltyOption,
    RepeatedWordPenaltyOption,
    RepetitionPenaltyOption,
    SampleTopKOption,
    SeedOption,
    TemperatureOption,
    TopPOption,
    sampler_settings,
)
from localpers.device.demo import (
    DEMO_USER,
    compare_on_demo,
    demo_articles,
    demo_methods,
    ensure_demo_user,
    style_hits,
)
from localpers.errors import InputError, LocalpersError
from localpers.methods.base import Method, RewriteOptions
from localpers.methods.card.method import fit_summary as card_fit_summary
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.consensus import MAX_CANDIDATES
from localpers.methods.registry import (
    BASELINE_METHOD,
    DEFAULT_METHOD,
    METHODS,
    get_method,
    listed,
    method_names,
    methods_taking,
)
from localpers.methods.reports import FIT_STAGE_LABELS, FitReport
from localpers.users.store import UserStore

LOG_EVERY_SECONDS = 10.0  # without a terminal, a long stage logs a line this often
MAX_STRENGTH = 100.0  # the range of the API's `strength` too


@contextmanager
def fit_progress(enabled: bool, interactive: bool = True, command: str = "fit") -> Iterator[Any]:
    """A rich progress bar fed by the Personalizer's (stage, done, total) callback.

    Without a terminal (nohup, CI logs, pipes) it logs `<command>: <stage> <done>/<total>` lines on standard
    error instead: when a stage ends, and every LOG_EVERY_SECONDS while it runs (an EXACT fit takes minutes).
    Disabled, it reports nothing.
    """
    if not enabled:
        yield None
        return
    if not interactive:
        yield _stage_logger(command)
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("{task.description:<26}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        transient=True,
    ) as progress:
        tasks: dict[str, Any] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = progress.add_task(FIT_STAGE_LABELS.get(stage, stage), total=total)
            progress.update(tasks[stage], completed=done)

        yield update


def _stage_logger(command: str) -> Any:
    # a stage's first report comes after its first unit of work: it is timed from the previous stage's end
    previous_end = time.monotonic()
    started: dict[str, float] = {}
    logged: dict[str, float] = {}

    def update(stage: str, done: int, total: int) -> None:
        nonlocal previous_end
        now = time.monotonic()
        started.setdefault(stage, previous_end)
        if done < total and now - logged.get(stage, started[stage]) < LOG_EVERY_SECONDS:
            return
        logged[stage] = now
        elapsed = now - started[stage]
        if done >= total:
            previous_end = now
            timing = f" ({elapsed:.1f} s)"
        else:  # at the pace so far
            timing = f", about {_duration(elapsed / done * (total - done))} left" if done > 0 else ""
        typer.echo(f"{command}: {FIT_STAGE_LABELS.get(stage, stage)} {done}/{total}{timing}", err=True)

    return update


def _duration(seconds: float) -> str:
    """`42 s`, `7 min`, `2.3 h`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def fit_command(
    user: UserOption = None,
    method: Annotated[
        str,
        typer.Option(
            "--method",
            "-m",
            help=f"One of: {', '.join(method_names(fitted=True))} ({DEFAULT_METHOD} by default).",
        ),
    ] = DEFAULT_METHOD,
    history_limit: Annotated[
        int | None, typer.Option(min=1, help="Use only the N most recent items.")
    ] = None,
    bundle: BundleOption = None,
    model: ModelOption = None,
    as_json: JsonOption = False,
) -> None:
    """Fit the user from their history: CARD's cluster and vector, or CoPe/EXACT with --method (all on this machine)."""
    chosen = get_method(method, for_fit=True)
    target = UserStore().resolve(user)
    with target.fitting():  # taken before the model loads: a second fit of the user is refused at once
        personalizer = Personalizer.open(model=model, bundle=bundle)
        try:
            with fit_progress(not as_json, sys.stderr.isatty()) as progress:
                fitted = chosen.fit(personalizer, target, history_limit=history_limit, progress=progress)
        except KeyboardInterrupt:
            if chosen.name != "card":
                raise
            typer.echo(
                f"interrupted; user {target.name!r} keeps its previous fit, and the pairs scored so far are saved:"
                " `localpers fit` goes on from there",
                err=True,
            )
            raise typer.Exit(130) from None
    if as_json:
        print_json(fitted.report, indent=None)
    else:
        typer.echo(fitted.summary)


def rewrite_command(
    text: Annotated[str, typer.Argument(help="Input text, or - to read standard input.")],
    user: UserOption = None,
    task: Annotated[
        str, typer.Option("--task", "-t", help="headline, title, paraphrase or free.")
    ] = "headline",
    method: Annotated[
        str, typer.Option("--method", "-m", help=f"One of: {', '.join(METHODS)}.")
    ] = DEFAULT_METHOD,
    strength: Annotated[
        float | None,
        float_option(
            "--strength",
            low=0.0,
            high=MAX_STRENGTH,
            help="CARD strength α (default: what fit chose, else the bundle's); for cope, its contrastive α (0.3).",
        ),
    ] = None,
    top_k: Annotated[int | None, typer.Option(min=1, help="Correct only the k best cluster tokens.")] = None,
    max_tokens: Annotated[
        int | None, typer.Option(min=1, max=2048, help="Token limit (default: the task's).")
    ] = None,
    stream: Annotated[bool, typer.Option("--stream/--no-stream", help="Print tokens as they come.")] = True,
    candidates: Annotated[
        int,
        typer.Option(
            min=1,
            max=MAX_CANDIDATES,
            help="Decode N outputs side by side (the greedy one and samples) and keep the one the others agree"
            " with most; slower (docs/PERFORMANCE.md). Greedy decoding, adapter methods only.",
        ),
    ] = 1,
    temperature: TemperatureOption = 0.0,
    sample_top_k: SampleTopKOption = 0,
    top_p: TopPOption = 1.0,
    min_p: MinPOption = 0.0,
    repetition_penalty: RepetitionPenaltyOption = 1.0,
    presence_penalty: PresencePenaltyOption = 0.0,
    frequency_penalty: FrequencyPenaltyOption = 0.0,
    repeated_word_penalty: RepeatedWordPenaltyOption = None,
    seed: SeedOption = None,
    grammar: GrammarOption = None,
    show_examples: Annotated[
        bool,
        typer.Option(
            "--examples",
            help="Then list, on standard error, the history items the prompt showed and why"
            " (--json always carries them).",
        ),
    ] = False,
    bundle: BundleOption = None,
    model: ModelOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write TEXT's headline/title/paraphrase the way the user writes (CARD by default)."""
    from localpers.cli.common import read_text_argument, stdout_stream
    from localpers.tasks import get_task

    source = read_text_argument(text)
    one_line = get_task(task).one_line  # an unknown task is refused before the model loads
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
        repeated_word_penalty=repeated_word_penalty,
    )
    chosen = get_method(method)
    check_method_options(chosen, strength=strength, top_k=top_k)
    if candidates > 1 and not sampling.greedy:
        raise LocalpersError(
            f"--candidates needs greedy decoding, not --temperature {temperature:g}; drop --temperature"
            " (or set it to 0), or drop --candidates",
            exit_code=2,
        )
    if candidates > 1 and chosen.own_decoder:
        raise LocalpersError(
            f"--candidates needs a method that decodes on an adapter, not {chosen.name} (it runs its own"
            " decoder); choose another --method or drop --candidates",
            exit_code=2,
        )
    store = UserStore()
    target = store.resolve(user) if (user or store.active_name() or chosen.needs_user) else None
    personalizer = Personalizer.open(model=model, bundle=bundle)
    notes: list[str] = []  # the method's remarks (a fallback, a cut text): on stderr, or in --json's "notes"
    payload = chosen.rewrite(
        personalizer,
        target,
        source,
        RewriteOptions(
            task=task,
            strength=strength,
            top_k=top_k,
            max_tokens=max_tokens,
            sampling=sampling,
            candidates=candidates,
            on_text=stdout_stream(strip_leading=one_line) if (stream and not as_json) else None,
            note=notes.append if as_json else (lambda text: typer.echo(f"note: {text}", err=True)),
        ),
    )
    if as_json:
        print_json({**payload, "notes": notes} if notes else payload, indent=None)
    elif stream:
        sys.stdout.write("\n")
    else:
        typer.echo(payload["text"])
    if show_examples and not as_json:
        typer.echo(shown_examples_text(payload.get("examples", [])), err=True)


def shown_examples_text(examples: list[dict[str, Any]]) -> str:
    """`rewrite --examples`: one line per history item the prompt showed, e.g. `  recent   3f2a...  Text`."""
    if not examples:
        return "the prompt showed no history items (no history for this task, or a method without them)"
    lines = [
        f"the prompt showed {len(examples)} of your history items (remove one: `localpers history remove ID`):"
    ]
    lines += [f"  {example['why']:<8} {example['id']}  {example['output']}" for example in examples]
    return "\n".join(lines)


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
    available = demo_articles()
    if articles is not None and articles > len(available):
        raise InputError(f"--articles: {len(available)} demo articles ship with localpers, not {articles}")
    chosen = available[: articles or len(available)]
    personalizer = Personalizer.open(model=model, bundle=bundle)
    store = UserStore()
    if not as_json:
        typer.echo(
            f"bundle {personalizer.bundle.directory} (k={personalizer.bundle.k}); backbone {personalizer.backbone.path.name}"
        )
    with fit_progress(not as_json, sys.stderr.isatty(), command="demo") as progress:
        demo, fitted_now = ensure_demo_user(personalizer, store, progress)
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
        typer.echo(card_fit_summary(DEMO_USER, FitReport(**report), demo.state().get("choice")))
    if rows_shown:
        _print_comparison(rows[:rows_shown], len(rows))
    counts = ", ".join(f"{listed(m).label} {hits[m]}/{len(rows)}" for m in demo_methods())
    typer.echo(
        f"the demo user's markers (a short kicker before a colon, or \"Here's Why\"; all 24 history items have one) "
        f"in the headlines of {counted(len(rows), 'invented article')}"
        + (f", each the consensus of {candidates} candidates" if candidates > 1 else "")
        + f": {counts}"
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

    title = f"Demo user (a punny optimist): {len(rows)} of the {counted} articles, one per row"
    table = Table(title=title, show_lines=True)
    table.add_column("article", ratio=3)
    for method in demo_methods():
        table.add_column(_column_title(method), ratio=2, style="bold" if method == DEFAULT_METHOD else None)
    for row in rows:
        table.add_row(row["article"], *(row[method] for method in demo_methods()))
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Add fit, rewrite and demo to the main app, each with one-line error handling."""
    from localpers.cli.common import one_line_errors

    app.command("fit", help=_with_methods(fit_command, method_names(fitted=True)))(
        one_line_errors(fit_command)
    )
    app.command("rewrite", help=_with_methods(rewrite_command, method_names()))(
        one_line_errors(rewrite_command)
    )
    app.command("demo")(one_line_errors(demo_command))


def _with_methods(command: Any, names: tuple[str, ...]) -> str:
    """The command's docstring and a paragraph saying what each of its `--method` choices does (`summary`)."""
    described = "; ".join(f"{name}: {METHODS[name].summary}" for name in names)
    return f"{inspect.cleandoc(command.__doc__ or '')}\n\nMethods: {described}."


def check_method_options(chosen: Method, *, strength: float | None, top_k: int | None) -> None:
    """Refuse `--strength` or `--top-k` for a method they mean nothing to (they were silently ignored)."""
    for flag, value, option in (("--strength", strength, "strength"), ("--top-k", top_k, "top_k")):
        takers = methods_taking(option)
        if value is not None and chosen.name not in takers:
            raise InputError(
                f"{flag} applies to {', '.join(takers)}, not to {chosen.name} (it has no correction to"
                f" set); drop {flag} or choose one of those methods"
            )
