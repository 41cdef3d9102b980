"""The `localpers` console script: start the command line, and end quietly if Ctrl-C comes while it loads.

Importing the command line (Typer, Rich, every command module) takes a few tenths of a second; a Ctrl-C in
that time would otherwise print Python's import traceback, and one while click parses the arguments would end
the command with exit 130 and no word at all. This module (and its package's `__init__`) import
nothing of localpers until `main` runs, which first routes Ctrl-C through `localpers.interrupts`; it does
nothing else.
"""

from __future__ import annotations

import sys


def main() -> None:
    from localpers import interrupts

    interrupts.install()  # a Ctrl-C that a C callback swallows is raised again when llama.cpp returns
    try:
        from localpers.cli.main import app

        app()  # each command reports its own Ctrl-C (`one_line_errors`); this catches one while Typer sets up
    except KeyboardInterrupt:
        _say_interrupted()
    except SystemExit as exit_:
        if _typer_swallowed_a_ctrl_c(exit_):
            _say_interrupted()
        raise


def _typer_swallowed_a_ctrl_c(exit_: SystemExit) -> bool:
    """Whether Typer turned a Ctrl-C into exit 130 without a word (one while click parses the command line).

    Typer raises its `Exit(130)` *from* the KeyboardInterrupt and then `sys.exit`s inside that handler; a
    command's own Ctrl-C report raises `Exit(130) from None` after printing its line, so it is not matched.
    """
    typer_exit = exit_.__context__
    return (
        exit_.code == 130 and typer_exit is not None and isinstance(typer_exit.__cause__, KeyboardInterrupt)
    )


def _say_interrupted() -> None:
    sys.stderr.write("interrupted\n")
    raise SystemExit(130) from None
