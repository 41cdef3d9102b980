"""The `localpers` console script: start the command line, and end quietly if Ctrl-C comes while it loads.

Importing the command line (Typer, Rich, every command module) takes a few tenths of a second; a Ctrl-C in
that time would otherwise print Python's import traceback, and one while click parses the arguments would end
the command with exit 130 and no word at all. This module (and its package's `__init__`) import
nothing of localpers until `main` runs, which first routes Ctrl-C (and SIGTERM, SIGHUP) through
`localpers.interrupts`; it does nothing else.
"""

from __future__ import annotations

import contextlib
import sys


def main() -> None:
    from localpers import interrupts

    interrupts.install()  # a Ctrl-C that a C callback swallows is raised again when llama.cpp returns
    try:
        from localpers.cli.main import app

        app()  # each command reports its own Ctrl-C (`one_line_errors`); this catches one while Typer sets up
    except KeyboardInterrupt as stop:  # also SIGTERM/SIGHUP (`interrupts.Terminated`)
        _say_stopped(stop)
    except SystemExit as exit_:
        swallowed = _ctrl_c_typer_swallowed(exit_)
        if swallowed is not None:
            _say_stopped(swallowed)
        raise


def _ctrl_c_typer_swallowed(exit_: SystemExit) -> KeyboardInterrupt | None:
    """The Ctrl-C (or stop signal) Typer turned into exit 130 without a word (one while click parses the
    command line), if it did.

    Typer raises its `Exit(130)` *from* the KeyboardInterrupt and then `sys.exit`s inside that handler; a
    command's own Ctrl-C report raises `Exit(130) from None` after printing its line, so it is not matched.
    """
    typer_exit = exit_.__context__
    if exit_.code != 130 or typer_exit is None:
        return None
    cause = typer_exit.__cause__
    return cause if isinstance(cause, KeyboardInterrupt) else None


def _say_stopped(stop: KeyboardInterrupt) -> None:
    from localpers import interrupts

    with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
        sys.stderr.write(f"{interrupts.stopped_word(stop)}\n")
    raise SystemExit(interrupts.exit_code(stop)) from None
