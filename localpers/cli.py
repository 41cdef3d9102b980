"""The `localpers` command line (Typer): version, doctor, generate.

Each command turns `LocalpersError` into one line on stderr and a non-zero exit code; `--json`
output is for scripts. Commands stay thin: the work happens in the modules they call.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from localpers import __version__
from localpers.cli_api import register as register_api_command
from localpers.cli_bench import register as register_bench_commands
from localpers.cli_bundle import register as register_bundle_commands
from localpers.cli_device import register as register_device_commands
from localpers.cli_methods import register as register_method_commands
from localpers.cli_repo import register as register_repo_commands
from localpers.cli_sampling import (
    FrequencyPenaltyOption,
    GrammarOption,
    MinPOption,
    PresencePenaltyOption,
    RepetitionPenaltyOption,
    SeedOption,
    TemperatureOption,
    TopKOption,
    TopPOption,
    sampler_settings,
)
from localpers.cli_tui import register as register_tui_command
from localpers.cli_users import history_app, user_app
from localpers.errors import LocalpersError
from localpers.untrusted import one_line

app = typer.Typer(
    name="localpers",
    help="An LLM that writes the way you write, without your writing leaving your machine.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

F = TypeVar("F", bound=Callable[..., Any])


def one_line_errors(func: F) -> F:
    """Print a LocalpersError as `error: ...` on stderr and exit with its code, never a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except LocalpersError as exc:
            # Messages quote outside input (file names, fields): escape anything that would break the
            # line (\n, U+2028) or drive the terminal (ESC).
            typer.echo(f"error: {one_line(str(exc))}", err=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            typer.echo("interrupted; nothing was changed", err=True)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def read_text_argument(text: str) -> str:
    """`-` reads standard input; anything else is the text itself."""
    if text == "-":
        data = sys.stdin.read()
        if not data.strip():
            raise LocalpersError("standard input was empty; pipe some text or pass it as an argument")
        return data
    if not text.strip():
        raise LocalpersError("the text is empty; pass some text or - to read standard input")
    return text


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"localpers {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version_callback, is_eager=True, help="Show the version and exit."
        ),
    ] = False,
) -> None:
    """An LLM that writes the way you write, without your writing leaving your machine."""


ModelOption = Annotated[
    str | None,
    typer.Option(
        "--model", envvar="LOCALPERS_MODEL", help="Backbone GGUF path (default: embedded Gemma 3 270M)."
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]


@app.command()
@one_line_errors
def doctor(model: ModelOption = None, as_json: JsonOption = False) -> None:
    """Show the backbone, llama.cpp build, threads, data directories and installed extras."""
    import os

    from localpers import paths
    from localpers.backbone import resolve_backbone
    from localpers.engine import Engine, llama_cpp_version, llama_system_info

    backbone = resolve_backbone(model)
    try:
        from localpers.encoder import encoder_dir

        encoder = str(encoder_dir())
    except LocalpersError as exc:
        encoder = f"missing: {exc}"
    # Loading the backbone is the only way to learn which buffer types llama.cpp gave its weights.
    with Engine(backbone.path, n_ctx=64, tap_layers=None) as engine:
        choice, weights = engine.buffer_choice, engine.weight_buffers
    extras = {
        name: importlib.util.find_spec(name) is not None
        for name in ("torch", "transformers", "peft", "gguf", "matplotlib", "pytest")
    }
    report = {
        "version": __version__,
        "backbone": {"path": str(backbone.path), "sha256": backbone.sha256, "source": backbone.source},
        "llama_cpp_python": llama_cpp_version(),
        "llama_system_info": llama_system_info(),
        "threads": os.cpu_count(),
        "encoder": encoder,
        "cpu_buffers": {
            "setting": choice.setting,
            "offered": list(choice.offered),
            "allowed": list(choice.allowed),
            "reason": choice.reason,
            "weights_mib": weights,
        },
        "layer_taps": "c"
        if importlib.util.find_spec("localpers._taps")
        else "python (slower: C callback not built)",
        "dirs": {
            "data": str(paths.data_dir()),
            "cache": str(paths.cache_dir()),
            "config": str(paths.config_dir()),
        },
        "extras": {
            "publish": all(extras[n] for n in ("torch", "transformers", "peft", "gguf")),
            **extras,
        },
    }
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    typer.echo(f"localpers {report['version']}")
    typer.echo(f"backbone      {backbone.path} ({backbone.source})")
    typer.echo(f"  sha256      {backbone.sha256}")
    typer.echo(f"llama.cpp     llama-cpp-python {report['llama_cpp_python']}")
    typer.echo(f"  system      {report['llama_system_info']}")
    typer.echo(f"threads       {report['threads']}")
    typer.echo(f"encoder       {encoder}")
    placed = ", ".join(f"{name} {mib:.1f} MiB" for name, mib in weights.items()) or "?"
    typer.echo(f"cpu buffers   {choice.reason}")
    typer.echo(f"  weights in  {placed}   (LOCALPERS_CPU_BUFFERS=auto|repack|plain|all)")
    typer.echo(f"layer taps    {report['layer_taps']}")
    for name, where in report["dirs"].items():
        typer.echo(f"{name + ' dir':<14}{where}")
    installed = ", ".join(f"{name}={'yes' if ok else 'no'}" for name, ok in report["extras"].items())
    typer.echo(f"extras        {installed}")


@app.command()
@one_line_errors
def generate(
    text: Annotated[str, typer.Argument(help="Input text, or - to read standard input.")],
    task: Annotated[str, typer.Option("--task", "-t", help="headline, title, paraphrase or free.")] = "free",
    max_tokens: Annotated[
        int | None, typer.Option(min=1, max=4096, help="Token limit (default: the task's).")
    ] = None,
    temperature: TemperatureOption = 0.0,
    top_k: TopKOption = 0,
    top_p: TopPOption = 1.0,
    min_p: MinPOption = 0.0,
    repetition_penalty: RepetitionPenaltyOption = 1.0,
    presence_penalty: PresencePenaltyOption = 0.0,
    frequency_penalty: FrequencyPenaltyOption = 0.0,
    seed: SeedOption = None,
    grammar: GrammarOption = None,
    adapter: Annotated[
        str | None, typer.Option(help="A GGUF LoRA adapter file to apply to the backbone.")
    ] = None,
    model: ModelOption = None,
    as_json: JsonOption = False,
) -> None:
    """Plain (non-personalized) streaming generation on the backbone, optionally with one adapter."""
    from localpers.backbone import resolve_backbone
    from localpers.engine import Engine
    from localpers.generation import generate as run_generation
    from localpers.tasks import get_task

    chosen_task = get_task(task)
    source_text = read_text_argument(text)
    sampling = sampler_settings(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        repetition_penalty=repetition_penalty,
        presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
        seed=seed,
        grammar=grammar,
    )
    backbone = resolve_backbone(model)
    engine = Engine(backbone.path, tap_layers=None)
    if adapter:
        engine.set_adapter(engine.load_adapter(adapter))

    def stream(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    result = run_generation(
        engine,
        chosen_task.prompt_for(source_text),
        max_tokens=max_tokens or chosen_task.default_max_tokens,
        sampling=sampling,
        stop=chosen_task.stop_strings,
        on_text=None if as_json else stream,
    )
    if as_json:
        payload = {
            "text": result.text.strip() if chosen_task.one_line else result.text,
            "task": chosen_task.name,
            "adapter": adapter,
            "backbone": str(backbone.path),
            "tokens": len(result.tokens),
            "stop_reason": result.stop_reason,
            "prompt_tokens": result.prompt_tokens,
            "prompt_ms": round(1000 * result.prompt_seconds, 2),
            "ms_per_token": round(result.ms_per_token, 2),
        }
        typer.echo(json.dumps(payload, ensure_ascii=False))
    else:
        sys.stdout.write("\n")


app.add_typer(user_app, name="user")
app.add_typer(history_app, name="history")
register_bundle_commands(app)
register_device_commands(app)
register_bench_commands(app)
register_tui_command(app)
register_method_commands(app)
register_api_command(app)
register_repo_commands(app)
import localpers.cli_publish  # noqa: E402, F401  (registers `publish`)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
