"""The `localpers` command line: one module per command group, assembled in `localpers.cli.main`.

The console script (pyproject's `[project.scripts]`) runs `localpers.cli.entry:main`, which imports
`localpers.cli.main` and starts its `app`; `python -m localpers.cli` runs the same app. `app` is also an
attribute of this package, loaded on first use, so that importing the package (as the console script does
before anything else) costs nothing. Shared helpers live in `localpers.cli.common`, which imports no
command module.
"""

from __future__ import annotations

from typing import Any

__all__ = ["app"]


def __getattr__(name: str) -> Any:
    if name == "app":
        from localpers.cli.main import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
