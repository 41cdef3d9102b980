"""The `localpers generate` command: the backbone alone, no bundle and no user (`localpers.cli.doctor` has doctor).

It runs the backbone (optionally with one adapter and llama.cpp's sampler settings) on a prompt.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from localpers.cli import completion
from localpers.cli.common import (
    JsonOption,
    ModelOption,
    echo,
    one_line_errors,
    print_json,
    read_text_argument,
    stdout_stream,
)
from localpers.cli.sampling import (
    FrequencyPenaltyOption,
    GrammarOption,
    MinPOption,
    PresencePenaltyOption,
    RepeatedWordPenaltyOption,
    RepetitionPenaltyOption,
    SeedOption,
    TemperatureOption,
    TopKOption,
    TopPOption,
    sampler_settings,
)
from localpers.engine import CONTEXT_TOKENS
from localpers.errors import InputError


def generate(
    text: Annotated[str, typer.Argument(help="Input text, or - to read standard input.")],
    task: Annotated[
        str,
        typer.Option(
            "--task", "-t", help="headline, title, paraphrase or free.", autocompletion=completion.task_names
        ),
    ] = "free",
    max_tokens: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=CONTEXT_TOKENS,
            help=f"Token limit (default: the task's; the prompt and the output share {CONTEXT_TOKENS} tokens).",
        ),
    ] = None,
    temperature: TemperatureOption = 0.0,
    top_k: TopKOption = 0,
    top_p: TopPOption = 1.0,
    min_p: MinPOption = 0.0,
    repetition_penalty: RepetitionPenaltyOption = 1.0,
    presence_penalty: PresencePenaltyOption = 0.0,
    frequency_penalty: FrequencyPenaltyOption = 0.0,
    repeated_word_penalty: RepeatedWordPenaltyOption = None,
    seed: SeedOption = None,
    grammar: GrammarOption = None,
    adapter: Annotated[
        Path | None, typer.Option(help="A GGUF LoRA adapter file to apply to the backbone.")
    ] = None,
    model: ModelOption = None,
    as_json: JsonOption = False,
) -> None:
    """Plain (non-personalized) streaming generation on the backbone, optionally with one adapter."""
    from localpers.engine import Engine
    from localpers.engine.backbone import resolve_backbone
    from localpers.engine.generation import generate as run_generation
    from localpers.tasks import get_task

    chosen_task = get_task(task)
    source_text = read_text_argument(text)
    # a text free or paraphrase would have to cut is refused, as by rewrite
    chosen_task.check_text(source_text)
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
        repeated_word_penalty=repeated_word_penalty,
    ).for_task(chosen_task.repeated_word_penalty)
    if adapter is not None and not adapter.is_file():  # told before the model loads
        problem = "it is a folder" if adapter.is_dir() else "no such file"
        raise InputError(f"--adapter {adapter}: {problem}; give a GGUF LoRA adapter file")
    backbone = resolve_backbone(model)
    engine = Engine(backbone.path, tap_layers=None)
    if adapter:
        engine.set_adapter(engine.load_adapter(adapter))

    result = run_generation(
        engine,
        chosen_task.prompt_for(source_text),
        max_tokens=max_tokens or chosen_task.default_max_tokens,
        sampling=sampling,
        stop=chosen_task.stop_strings,
        on_text=None if as_json else stdout_stream(strip_leading=chosen_task.one_line),
    )
    if chosen_task.is_cut(source_text):  # headline and title read an article's start, and say so
        echo(f"note: {chosen_task.cut_note(source_text, chosen_task.max_input_chars)}", err=True)
    if as_json:
        payload = {
            "text": result.text.strip() if chosen_task.one_line else result.text,
            "task": chosen_task.name,
            "adapter": None if adapter is None else str(adapter),
            "backbone": str(backbone.path),
            "tokens": len(result.tokens),
            "stop_reason": result.stop_reason,
            "prompt_tokens": result.prompt_tokens,
            "prompt_ms": round(1000 * result.prompt_seconds, 2),
            "ms_per_token": round(result.ms_per_token, 2),
        }
        print_json(payload, indent=None)
    else:
        sys.stdout.write("\n")
    if result.stop_reason == "context":
        echo(
            f"note: the output stops where the model's {CONTEXT_TOKENS}-token context is full (the prompt had"
            f" {result.prompt_tokens}); give a shorter text for a longer output",
            err=True,
        )


def register(app: typer.Typer) -> None:
    """Add `generate` to the main app with one-line error handling."""
    app.command("generate")(one_line_errors(generate))
