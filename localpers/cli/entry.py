"""The `localpers` console script: start the command line, and end quietly if Ctrl-C comes while it loads.

Importing the command line (Typer, Rich, every command module) takes a few tenths of a second; a Ctrl-C in
that time would otherwise print Python's import traceback. This module (and its package's `__init__`) import
nothing of localpers until `main` runs; it does nothing else.
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from localpers.cli.main import app
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None
    app()
