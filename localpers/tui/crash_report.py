"""`tracebacks_without_locals`: Textual's crash report without each frame's local variables.

Textual prints a crash's traceback with every frame's locals; in this app they hold the draft and the history's
text, which a user may paste into a bug report. This module only swaps rich's Traceback for the call's duration.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def tracebacks_without_locals() -> Iterator[None]:
    """While inside, every rich Traceback made (Textual makes its crash report's inside the call) shows no locals."""
    import rich.traceback

    original = rich.traceback.Traceback

    class WithoutLocals(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["show_locals"] = False
            super().__init__(*args, **kwargs)

    rich.traceback.Traceback = WithoutLocals  # type: ignore[misc]
    try:
        yield
    finally:
        rich.traceback.Traceback = original  # type: ignore[misc]
