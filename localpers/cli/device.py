"""CLI commands of the device side of CARD: `fit` and `rewrite` (`localpers.cli.demo` has `demo`).

They load one `Personalizer` (backbone + bundle) per invocation and read/write users through the
store. User text stays in the user's folder; nothing here opens a network connection.
"""

from __future__ import annotations

import inspect
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from localpers import interrupts
from localpers.cli import completion
from localpers.cli.common import (
    BundleOption,
    JsonOption,
    ModelOption,
    UserOption,
    echo,
    print_json,
    stopped_exit,
)
from localpers.cli.numbers import float_option
from localpers.cli.progress import fit_progress
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
from localpers.engine.context import CONTEXT_TOKENS
from localpers.errors import InputError, LocalpersError
from localpers.methods.bounds import MAX_STRENGTH, MAX_TOP_K
from localpers.methods.consensus import MAX_CANDIDATES
from localpers.methods.registry import DEFAULT_METHOD, get_method, listed, method_names, methods_taking
from localpers.untrusted import one_line

if TYPE_CHECKING:
    from localpers.methods.base import Method
    from localpers.users.store import User


def fit_command(
    user: UserOption = None,
    method: Annotated[
        str,
        typer.Option(
            "--method",
            "-m",
            help=f"One of: {', '.join(method_names(fitted=True))} ({DEFAULT_METHOD} by default).",
            autocompletion=completion.fitted_method_names,
        ),
    ] = DEFAULT_METHOD,
    history_limit: Annotated[
        int | None, typer.Option(min=1, help="Use only the N most recent items.")
    ] = None,
    refit: Annotated[
        bool,
        typer.Option(
            "--refit",
            help="Fit even when the stored fit was made from this same history, bundle and version (it is"
            " kept as it is by default: a new fit would reuse the model outputs cached for these items and come"
            " out the same). EXACT's index is always rebuilt, from its cached searches.",
        ),
    ] = False,
    bundle: BundleOption = None,
    model: ModelOption = None,
    as_json: JsonOption = False,
) -> None:
    """Fit the user from their history: CARD's cluster and vector, or CoPe/EXACT with --method (all on this machine)."""
    from localpers.methods.card.personalizer import Personalizer
    from localpers.paths import refuse_unwritable
    from localpers.users.store import UserStore

    chosen = get_method(method, for_fit=True)
    target = UserStore().resolve(user)
    with target.fitting():  # taken before the model loads: a second fit of the user is refused at once
        personalizer = Personalizer.open(model=model, bundle=bundle)
        current = None if refit else chosen.current_fit(personalizer, target, history_limit=history_limit)
        if current is not None:
            if as_json:
                print_json({**current.report, "unchanged": True}, indent=None)
            else:
                echo(
                    f"user {target.name!r} is already fitted on this history with this bundle; nothing to do"
                    " (`--refit` fits again). The stored fit:",
                    err=True,
                )
                echo(current.summary)
            return
        # a refit finds its lock file made already: without this it did all its work, then failed at the save
        # (a fit with nothing to do, above, writes nothing and may run in a read-only folder)
        refuse_unwritable(
            target.dir, f"{target.dir}, the folder of user {target.name!r},", "fix that, then fit again"
        )
        try:
            with fit_progress(not as_json, sys.stderr.isatty()) as progress:
                fitted = chosen.fit(personalizer, target, history_limit=history_limit, progress=progress)
        except KeyboardInterrupt as stop:
            if chosen.name not in ("card", "exact"):
                raise
            given = {"--history-limit": history_limit, "--refit": refit, "--bundle": bundle, "--model": model}
            kept = _what_a_stopped_fit_kept(
                chosen.name, target, given, saved=not interrupts.was_unsaved(stop)
            )
            raise stopped_exit(stop, kept) from None
    if as_json:
        print_json(
            {**fitted.report, "unchanged": bool(fitted.report.get("kept_without_history"))}, indent=None
        )
    else:
        echo(fitted.summary)


def _what_a_stopped_fit_kept(method: str, user: User, given: dict[str, object], *, saved: bool = True) -> str:
    """What a fit stopped by Ctrl-C left (the previous fit, if any, and the work saved so far, unless `saved` is
    False: a cache write failed) and the command that goes on from there: the user and the options the stopped one
    was given (`given`: option -> value, None or False when not given)."""
    import shlex

    from localpers.methods.card.pair_cache import FEATURES_FILE, NEGATIVES_FILE
    from localpers.methods.exact_cache import SELECTIONS_FILE
    from localpers.methods.exact_index import index_path

    if not user.dir.is_dir():
        return (
            f"user {user.name!r} no longer exists (deleted while this fit ran); nothing of the fit was kept"
        )
    again = ["localpers", "fit", *(["--method", method] if method != "card" else []), "--user", user.name]
    for option, value in given.items():
        if value is True:
            again.append(option)
        elif value not in (None, False):
            again += [option, str(value)]
    if method == "card":
        try:
            fitted = isinstance(user.state().get("fit"), dict)
        except LocalpersError:
            fitted = True  # a damaged state.json: left as it was, as any other
        name, work, caches = "fit", "the pairs scored so far", (NEGATIVES_FILE, FEATURES_FILE)
    else:
        fitted = index_path(user).is_file()
        name, work, caches = "EXACT index", "the attributes chosen so far", (SELECTIONS_FILE,)
    kept = f"keeps its previous {name}, and" if fitted else f"has no {name} yet;"
    if saved and not any((user.dir / cache).is_file() for cache in caches):
        return (
            f"user {user.name!r} {kept} nothing of this fit was saved (it stopped before its first"
            f" {'pair' if method == 'card' else 'search'} was done): `{shlex.join(again)}` starts again"
        )
    if not saved:
        return (
            f"user {user.name!r} {kept} {work} could not all be saved (a cache in its folder could not be written):"
            f" `{shlex.join(again)}` does that work again"
        )
    return f"user {user.name!r} {kept} {work} are saved: `{shlex.join(again)}` goes on from there"


def rewrite_command(
    text: Annotated[str, typer.Argument(help="Input text, or - to read standard input.")],
    user: UserOption = None,
    task: Annotated[
        str,
        typer.Option(
            "--task", "-t", help="headline, title, paraphrase or free.", autocompletion=completion.task_names
        ),
    ] = "headline",
    method: Annotated[
        str,
        typer.Option(
            "--method",
            "-m",
            help=f"One of: {', '.join(method_names())}.",
            autocompletion=completion.method_names,
        ),
    ] = DEFAULT_METHOD,
    strength: Annotated[
        float | None,
        float_option(
            "--strength",
            low=0.0,
            high=MAX_STRENGTH,
            help="CARD strength α of your vector (default: what fit chose, else the bundle's); the token bias fit"
            " chose keeps its own strength (--json: bias_strength; --method global-history has no correction);"
            " for cope, its contrastive α (0.3).",
        ),
    ] = None,
    top_k: Annotated[
        int | None, typer.Option(min=1, max=MAX_TOP_K, help="Correct only the k best cluster tokens.")
    ] = None,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=CONTEXT_TOKENS,
            help=f"Token limit (default: the task's; the prompt and the output share {CONTEXT_TOKENS} tokens).",
        ),
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
    from localpers.methods.base import RewriteOptions
    from localpers.methods.card.personalizer import Personalizer
    from localpers.tasks import get_task
    from localpers.users.store import UserStore

    source = read_text_argument(text)
    # an unknown task, or a text it would have to cut, is refused before the model loads
    chosen_task = get_task(task)
    chosen_task.check_text(source)
    one_line = chosen_task.one_line
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
    late_notes: list[str] = []  # remarks made once the output began streaming: printed after its line ends
    sink = stdout_stream(strip_leading=one_line) if (stream and not as_json) else None
    streaming = False

    def on_text(piece: str) -> None:
        nonlocal streaming
        assert sink is not None
        if not piece:  # no text, only a step of a decode that could be stopped here
            return
        streaming = True
        sink(piece)

    def note(text: str) -> None:
        notes.append(text)
        if streaming:
            late_notes.append(text)
        elif not as_json:
            echo(f"note: {text}", err=True)

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
            on_text=on_text if sink is not None else None,
            note=note,
        ),
    )
    if payload.get("stop_reason") == "context":
        note(
            f"the output stops where the model's {CONTEXT_TOKENS}-token context is full (the prompt had"
            f" {payload.get('prompt_tokens')}); give a shorter text for a longer output"
        )
    if as_json:
        print_json({**payload, "notes": notes} if notes else payload, indent=None)
        return
    if stream:
        sys.stdout.write("\n")
        sys.stdout.flush()
        for late in late_notes:
            echo(f"note: {late}", err=True)
    else:
        echo(payload["text"])
    if show_examples and not as_json:
        echo(shown_examples_text(payload.get("examples", []), target.name if target else None), err=True)


def shown_examples_text(examples: list[dict[str, Any]], user_name: str | None) -> str:
    """`rewrite --examples`: one line per history item the prompt showed, e.g. `  recent   3f2a...  Text`.

    The removal hint names the user: item ids are content hashes two users share, and a bare `history remove`
    removes from the active user."""
    if not examples:
        return "the prompt showed no history items (no history for this task, or a method without them)"
    for_user = f" --user {user_name}" if user_name else ""
    lines = [
        f"the prompt showed {len(examples)} of your history items (remove one:"
        f" `localpers history remove ID{for_user}`):"
    ]
    # one line each, as `history list` shows them: a stored output may hold line breaks (a free-text item)
    lines += [f"  {example['why']:<8} {example['id']}  {one_line(example['output'])}" for example in examples]
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add fit and rewrite to the main app, each with one-line error handling."""
    from localpers.cli.common import one_line_errors

    app.command("fit", help=_with_methods(fit_command, method_names(fitted=True)))(
        one_line_errors(fit_command)
    )
    app.command("rewrite", help=_with_methods(rewrite_command, method_names()))(
        one_line_errors(rewrite_command)
    )


def _with_methods(command: Any, names: tuple[str, ...]) -> str:
    """The command's docstring and a paragraph saying what each of its `--method` choices does (`summary`)."""
    described = "; ".join(f"{name}: {listed(name).summary}" for name in names)
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
