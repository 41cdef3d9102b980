"""Text fitting for the TUI's tables: cut a string to a column's width. Knows nothing of widgets."""

from __future__ import annotations


def shorten(text: str, width: int) -> str:
    """`text`, or its first `width - 1` characters and an ellipsis when it is longer than `width`."""
    return text if len(text) <= width else text[: width - 1] + "…"


def one_line(text: str) -> str:
    """`text` with every run of whitespace (newlines included) as one space."""
    return " ".join(text.split())
