"""`KeyFooter`: the one-line key bar every screen of the TUI docks at its bottom.

Compact and without the command palette's hint (ctrl+p still opens it), so 80 columns show every key of the
main screen. Each modal screen yields its own, so an open dialog shows its keys rather than the dimmed ones
of the screen behind it.
"""

from __future__ import annotations

from textual.widgets import Footer


class KeyFooter(Footer):
    def __init__(self) -> None:
        super().__init__(compact=True, show_command_palette=False)
