"""The `localpers` console script: start the command line, and end quietly if Ctrl-C comes while it loads.

Importing the command line (Typer, Rich, every command module) takes a few tenths of a second; a Ctrl-C in
that time would otherwise print Python's import traceback. This module (and its package's `__init__`) import
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
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None
