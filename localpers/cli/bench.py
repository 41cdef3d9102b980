"""CLI command `localpers bench`: CARD against its baselines on held-out users, with a report and plots.

Thin: it parses options, shows one progress bar per method and prints where the results went; the
work is in `localpers.bench`. The benchmark keeps its own user store under `--out`, never the real one.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from localpers.cli.common import echo, print_json, stopped_exit
from localpers.engine.threads import MAX_THREADS
from localpers.errors import InputError

# Written out so `--help` loads no model code; tests/test_bench.py checks it names every method and preset of
# `localpers.bench.registry` / `method_names`.
METHODS_HELP = (
    "Methods or presets, repeatable or comma-separated: global, rag, global-history, cluster, card, card-auto, "
    "card-global, card-factored-u, card-full-u, cope, exact; parameters as card@strength=0.5,top_k=50, rag@k=2, "
    "card@history=5; presets product (default: global, global-history, card-auto, what the device does), "
    "main (the paper's table: global, rag, cluster, card), low-resource, alpha-sweep, topk-sweep, related "
    "(cope, exact). global is always included."
)
SUMMARY_WIDTH_WITHOUT_TERMINAL = 130  # columns of the printed summary in a log or a pipe
MAX_SEED = 2**32 - 1  # numpy's seeds are unsigned 32-bit words
MIN_RESAMPLES, MAX_RESAMPLES = 100, 100_000  # an interval draws a resamples x queries index array at once
DEFAULT_STYLES = "sentence-case,kicker,question,ampersand"
DEFAULT_PROBE_HISTORY = "5,10,20,all"


def _log_progress(method: str, done: int, total: int, detail: str) -> None:
    """Without a terminal (nohup, CI logs): one line per finished user."""
    if not detail and done > 0:
        echo(f"bench: {method} {done}/{total} users", err=True)


@contextmanager
def method_progress(enabled: bool, interactive: bool) -> Iterator[Any]:
    """One rich progress bar per method, counting users, with the current stage as its description.

    Without a terminal it logs a line per finished user instead; disabled, it reports nothing.
    """
    if not enabled:
        yield None
        return
    if not interactive:
        yield _log_progress
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.fields[method]:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        transient=False,
    ) as progress:
        tasks: dict[str, Any] = {}

        def update(method: str, done: int, total: int, detail: str) -> None:
            if method not in tasks:
                tasks[method] = progress.add_task(detail, total=total, method=method)
            progress.update(tasks[method], completed=done, description=detail)

        yield update


def bench_command(
    data: Annotated[
        Path, typer.Option("--data", help="Users in the shared-data JSONL format (history + queries).")
    ],
    out: Annotated[Path, typer.Option("--out", help="Output directory (results, report, plots, cache).")],
    methods: Annotated[
        list[str] | None,
        typer.Option(
            "--methods",
            "-m",
            help=METHODS_HELP,
        ),
    ] = None,
    max_users: Annotated[int | None, typer.Option(min=1, help="Only the first N users of the file.")] = None,
    max_queries: Annotated[int | None, typer.Option(min=1, help="Only the first N queries per user.")] = None,
    dev_split: Annotated[
        bool,
        typer.Option(
            "--dev-split",
            help="Train authors (e.g. train.jsonl): each author's most recent 30% become the queries, as in "
            "test.jsonl. Choose settings on this, never on the test queries.",
        ),
    ] = False,
    history_limit: Annotated[
        int | None, typer.Option(min=0, help="Fit on the N most recent history items only (default: all).")
    ] = None,
    seed: Annotated[
        int, typer.Option(min=0, max=MAX_SEED, help="Seed of the bootstrap resampling (0 to 2**32-1).")
    ] = 0,
    bootstrap: Annotated[
        int,
        typer.Option(
            min=MIN_RESAMPLES, max=MAX_RESAMPLES, help="Bootstrap resamples (100 to 100,000; default 10,000)."
        ),
    ] = 10_000,
    bundle: Annotated[
        Path | None, typer.Option("--bundle", help="Bundle directory (default: the pulled or demo bundle).")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", envvar="LOCALPERS_MODEL", help="Backbone GGUF path (default: embedded)."),
    ] = None,
    threads: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=MAX_THREADS,
            help="llama.cpp threads (default: LOCALPERS_THREADS, else all CPUs; 1 is faster on a CPU shared with other work).",
        ),
    ] = None,
    probes: Annotated[
        bool,
        typer.Option(
            "--probes",
            help="Style probes instead of the ROUGE benchmark: restyle every gold headline, fit on N history "
            "items, report how often outputs carry the style (default methods rag, cluster; 3 queries per user).",
        ),
    ] = False,
    styles: Annotated[
        str | None,
        typer.Option(
            help=f"With --probes: comma-separated styles (sentence-case, kicker, question, ampersand; default "
            f"{DEFAULT_STYLES})."
        ),
    ] = None,
    probe_history: Annotated[
        str | None,
        typer.Option(
            help="With --probes: comma-separated history sizes, 'all' for the whole history (default "
            f"{DEFAULT_PROBE_HISTORY}); it takes the place of --history-limit."
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help='Print results.json to stdout, "ok": true first, instead of a summary.'),
    ] = False,
) -> None:
    """Evaluate methods on held-out users: fit on each history, generate each query, score with ROUGE.

    Resumable: finished (method, user) pairs are cached under --out and reused by the next run.
    """
    from localpers.bench import BenchConfig, run_and_write
    from localpers.bench.data import check_data_path
    from localpers.bench.method_names import DEFAULT_PRESET

    check_data_path(data)
    command = "localpers bench " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:])
    _check_probe_options(probes, styles, probe_history, history_limit)
    if probes:
        _run_probes(
            data,
            out,
            methods,
            # an empty value is refused (as `--styles ,` is), not read as the defaults
            DEFAULT_STYLES if styles is None else styles,
            DEFAULT_PROBE_HISTORY if probe_history is None else probe_history,
            max_users,
            max_queries,
            seed,
            bootstrap,
            bundle,
            model,
            threads,
            command,
            as_json,
            dev_split,
        )
        return
    config = BenchConfig(
        data=data,
        out=out,
        methods=methods or [DEFAULT_PRESET],
        max_users=max_users,
        max_queries=max_queries,
        history_limit=history_limit,
        seed=seed,
        bundle=bundle,
        model=model,
        n_resamples=bootstrap,
        threads=threads,
        command=command,
        dev_split=dev_split,
    )
    try:
        with method_progress(not as_json, sys.stderr.isatty()) as progress:
            written = run_and_write(config, progress=progress, notify=_print_note)
    except KeyboardInterrupt as stop:
        raise stopped_exit(stop, _what_a_stop_kept(out)) from None
    if as_json:
        print_json(written.results)
        return
    _print_summary(written.results)
    echo(f"report   {written.report_path}")
    echo(f"results  {written.results_path}")
    echo(f"outputs  {written.outputs_path} (generated text: keep it out of version control)")
    for plot in written.plots:
        echo(f"plot     {plot}")


def _check_probe_options(
    probes: bool, styles: str | None, probe_history: str | None, history_limit: int | None
) -> None:
    """Refuse an option the chosen mode would ignore: --styles/--probe-history without --probes, and
    --history-limit with it (each probe fits on the --probe-history sizes)."""
    if probes and history_limit is not None:
        raise InputError(
            "--history-limit does not apply with --probes: each probe fits on the most recent "
            "--probe-history items; give the sizes there, e.g. --probe-history 5,20"
        )
    if not probes:
        for option, value in (("--styles", styles), ("--probe-history", probe_history)):
            if value is not None:
                raise InputError(f"{option} applies only with --probes; add --probes or leave {option} out")


def _what_a_stop_kept(out: Path) -> str:
    """What a Ctrl-C (or SIGTERM) left in `out`: the cache, and whether its top-level outputs are one run's set."""
    from localpers.bench import RESULTS_NAME

    kept = (
        f"the users finished so far are kept in {out / 'cache'} and reused when the same command runs again; "
    )
    if (out / RESULTS_NAME).is_file():
        return kept + (
            f"{out / RESULTS_NAME} and the report, outputs and plots beside it are all from one run (this "
            "one's if it had finished writing them, else the earlier one's)"
        )
    return kept + f"{out} holds no {RESULTS_NAME}, so any report, outputs or plots there are incomplete"


def _print_note(note: str) -> None:
    """A note on how the data file was read, on stderr before the run (and again in the summary)."""
    echo(f"note: {note}", err=True)


def _rate(rate: float | None) -> str:
    return "n/a" if rate is None else f"{100 * rate:.0f}%"


def _parse_sizes(text: str) -> tuple[int | None, ...]:
    sizes: list[int | None] = []
    for piece in text.split(","):
        piece = piece.strip()
        if piece == "all":
            sizes.append(None)
        elif piece.isdigit() and int(piece) > 0:
            sizes.append(int(piece))
        else:
            raise InputError(f"--probe-history: {piece!r} is not a positive count or 'all'; e.g. 5,10,20,all")
    return tuple(sizes)


def _run_probes(
    data: Path,
    out: Path,
    methods: list[str] | None,
    styles: str,
    probe_history: str,
    max_users: int | None,
    max_queries: int | None,
    seed: int,
    bootstrap: int,
    bundle: Path | None,
    model: str | None,
    threads: int | None,
    command: str,
    as_json: bool,
    dev_split: bool = False,
) -> None:
    from localpers.bench.method_names import check_method_names, split_method_list
    from localpers.bench.probes import (
        DEFAULT_PROBE_METHODS,
        DEFAULT_QUERIES_PER_USER,
        ProbeConfig,
        run_probes,
    )
    from localpers.bench.styles import get_style

    chosen = [piece for text in (methods or DEFAULT_PROBE_METHODS) for piece in split_method_list(text)]
    check_method_names([name for name in chosen if name])
    style_names = [name.strip() for name in styles.split(",") if name.strip()]
    for name in style_names:
        get_style(name)
    if not style_names:
        raise InputError("--styles: name at least one style, e.g. --styles kicker")
    config = ProbeConfig(
        data=data,
        out=out,
        styles=style_names,
        methods=[name for name in chosen if name],
        history_sizes=_parse_sizes(probe_history),
        max_users=max_users,
        max_queries=max_queries or DEFAULT_QUERIES_PER_USER,
        seed=seed,
        n_resamples=bootstrap,
        bundle=bundle,
        model=model,
        threads=threads,
        command=command,
        dev_split=dev_split,
    )
    with method_progress(not as_json, sys.stderr.isatty()) as progress:
        result = run_probes(config, progress=progress, notify=_print_note)
    if as_json:
        print_json(result)
        return
    for style in result["styles"]:
        rates = ", ".join(f"{name} {_rate(row['hit']['rate'])}" for name, row in style["methods"].items())
        echo(f"{style['style']:<14} {rates}")
    echo(f"report   {out / 'probes.md'}")
    echo(f"plot     {out / 'probes.png'}")


def _print_summary(results: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from localpers.bench.siblings import sibling_summary

    table = Table(title=f"{results['config']['n_users']} users, {results['config']['n_queries']} queries")
    columns = (
        "method",
        "R-1",
        "R-L",
        "ΔR-1 vs global [95% CI]",
        "authors up",
        "ms/token",
        "fit s/user",
        "bytes/user",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "method" else "right")
    for name, row in results["methods"].items():
        delta = results["deltas_vs_global"].get(name, {}).get("rouge1")
        shown = f"{delta[1]:+.4f} [{delta[0]:+.4f}, {delta[2]:+.4f}]" if delta else "–"
        authors = (results.get("authors_vs_global") or {}).get(name)
        table.add_row(
            name,
            f"{row['rouge1']:.4f}",
            f"{row['rougeL']:.4f}",
            shown,
            f"{authors['improved']}/{authors['authors']}" if authors else "–",
            f"{row['ms_per_token']:.2f}",
            f"{row['fit_s_per_user']:.2f}",
            str(row["bytes_per_user"]),
        )
    console = Console()
    if not console.is_terminal:  # a log or a pipe: rich's 80 columns would wrap every interval
        console = Console(width=SUMMARY_WIDTH_WITHOUT_TERMINAL)
    console.print(table)
    for note in [*(results["config"].get("data_notes") or []), *(results["config"].get("run_notes") or [])]:
        echo(f"note     {note}")
    targets = results.get("targets")
    if targets:
        echo(f"targets  {targets['method']} against global: {targets['summary']}")
        siblings = sibling_summary(results.get("by_sibling") or {}, targets["method"])
        if siblings:
            echo(f"siblings {siblings} (report.md: where the gain comes from)")


def register(app: typer.Typer) -> None:
    """Add `bench` to the main app with one-line error handling."""
    from localpers.cli.common import one_line_errors

    app.command("bench")(one_line_errors(bench_command))
