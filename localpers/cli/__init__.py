"""The `localpers` command line: one module per command group, assembled in `localpers.cli.main`.

`localpers.cli:app` is the console entry point (pyproject's `[project.scripts]`); `python -m localpers.cli`
runs the same app. Shared helpers live in `localpers.cli.common`, which imports no command module.
"""

from localpers.cli.main import app, main

__all__ = ["app", "main"]
