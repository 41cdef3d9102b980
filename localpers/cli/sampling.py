"""The sampling options of `generate`, `rewrite` and `tui`, each mapped onto one of llama.cpp's samplers.

The option types are shared so the three commands spell and check them alike: a float option must be a finite
number in the range its --help shows (`localpers.cli.numbers`); `sampler_settings` turns the values into a
validated `SamplerSettings` (an unreadable grammar file is a one-line error with exit code 2). Defaults are
greedy decoding. This module decodes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from localpers.cli.numbers import float_option
from localpers.errors import LocalpersError

if TYPE_CHECKING:
    from localpers.engine.decoding import SamplerSettings

PANEL = "Sampling (llama.cpp's sampler chain)"

TemperatureOption = Annotated[
    float,
    float_option("--temperature", low=0.0, help="0 = greedy (default); > 0 samples.", rich_help_panel=PANEL),
]
TopKOption = Annotated[
    int, typer.Option(min=0, help="Keep the k most likely tokens (0 = all).", rich_help_panel=PANEL)
]
SampleTopKOption = Annotated[
    int,
    typer.Option(
        "--sample-top-k", min=0, help="Keep the k most likely tokens (0 = all).", rich_help_panel=PANEL
    ),
]
TopPOption = Annotated[
    float,
    float_option(
        "--top-p",
        low=0.0,
        high=1.0,
        low_open=True,
        help="Nucleus: keep the smallest set with this mass (1 = off).",
        rich_help_panel=PANEL,
    ),
]
MinPOption = Annotated[
    float,
    float_option(
        "--min-p",
        low=0.0,
        high=0.99,
        help="Drop tokens less likely than min-p x the best one.",
        rich_help_panel=PANEL,
    ),
]
RepetitionPenaltyOption = Annotated[
    float,
    float_option(
        "--repetition-penalty",
        low=0.0,
        high=10.0,
        low_open=True,
        help="> 1 discourages tokens already generated (1 = off).",
        rich_help_panel=PANEL,
    ),
]
PresencePenaltyOption = Annotated[
    float,
    float_option(
        "--presence-penalty",
        low=-2.0,
        high=2.0,
        help="Lowers every token already generated once.",
        rich_help_panel=PANEL,
    ),
]
FrequencyPenaltyOption = Annotated[
    float,
    float_option(
        "--frequency-penalty",
        low=-2.0,
        high=2.0,
        help="Lowers tokens by how often they were generated.",
        rich_help_panel=PANEL,
    ),
]
RepeatedWordPenaltyOption = Annotated[
    float | None,
    float_option(
        "--repeated-word-penalty",
        low=0.0,
        high=100.0,
        help="Nats off a word the output already holds (words only: digits and quotes are spared). "
        "Default: the task's, 3 for headline and title (it brings repeats down to the authors' rate, "
        "RESULTS 0ze), off for paraphrase and free. 0 = off.",
        rich_help_panel=PANEL,
    ),
]
# `engine.decoding.RANDOM_SEED` (2**32 - 1) asks llama.cpp for a random seed; a seed is below it (the engine
# module is not imported here: `--help` would load it)
MAX_SEED = 2**32 - 2
SeedOption = Annotated[
    int | None,
    typer.Option(min=0, max=MAX_SEED, help="Seed of the random draw.", rich_help_panel=PANEL),
]
GrammarOption = Annotated[
    Path | None,
    typer.Option(
        help="A GBNF grammar file (llama.cpp's format, rule `root`): the output must match it.",
        rich_help_panel=PANEL,
    ),
]


def read_grammar(path: Path | None) -> str | None:
    """The text of a GBNF file, or a one-line error (a FIFO, a device or a file over what the engine takes is
    refused without being read through)."""
    import stat

    from localpers.engine.decoding import MAX_GRAMMAR_CHARACTERS

    if path is None:
        return None
    limit = MAX_GRAMMAR_CHARACTERS * 4  # bytes: up to 4 a character
    try:
        info = path.stat()
        if stat.S_ISDIR(info.st_mode):
            problem = "it is a directory"
        elif not stat.S_ISREG(info.st_mode):
            problem = "not a regular file (a FIFO or a device)"
        elif info.st_size > limit:
            problem = f"{info.st_size:,} bytes, more than the {limit:,} a grammar may have"
        else:
            return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        problem = "no such file"
    except IsADirectoryError:
        problem = "it is a directory"
    except UnicodeDecodeError:
        problem = "not UTF-8 text"
    except OSError as exc:
        problem = exc.strerror or exc.__class__.__name__
    raise LocalpersError(
        f"cannot read grammar file {path}: {problem}; give a GBNF file (llama.cpp's format)", exit_code=2
    )


def sampler_settings(
    *,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    seed: int | None = None,
    grammar: Path | None = None,
    repeated_word_penalty: float | None = None,
) -> SamplerSettings:
    """The command-line options as llama.cpp sampler settings (validated)."""
    from localpers.engine.decoding import SamplerSettings

    return SamplerSettings(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        repeat_penalty=repetition_penalty,
        presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
        seed=seed,
        grammar=read_grammar(grammar),
        grammar_label=f"the grammar in {grammar}" if grammar is not None else "the grammar",
        repeated_word_penalty=repeated_word_penalty,
    ).validated()
