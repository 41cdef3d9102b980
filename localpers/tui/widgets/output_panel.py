"""`OutputPanel`: one generated output, streamed in piece by piece, with a status line under it.

The app sets `title` (which method produced it), calls `begin` when a generation starts, `append` for each
streamed piece and `finish`/`fail` at the end. The panel keeps the text; it never generates anything.
"""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static


class OutputPanel(Static):
    """A bordered block of generated text; the border subtitle says whether it is complete."""

    DEFAULT_CSS = """
    OutputPanel {
        height: 1fr;
        border: round $secondary;
        padding: 0 1;
        overflow-y: auto;
    }
    OutputPanel.personal {
        border: round $success;
    }
    OutputPanel.busy {
        border-subtitle-color: $warning;
    }
    OutputPanel.failed {
        border-subtitle-color: $error;
    }
    """

    text: reactive[str] = reactive("", layout=True)
    status: reactive[str] = reactive("")
    placeholder: reactive[str] = reactive("")

    def __init__(self, title: str, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.border_title = title
        self.complete = False

    def begin(self, status: str) -> None:
        """A new generation: clear the text and show `status` (e.g. "generating…")."""
        self.complete = False
        self.text = ""
        self.status = status
        self.set_class(True, "busy")
        self.set_class(False, "failed")

    def append(self, piece: str) -> None:
        self.text += piece

    def finish(self, text: str, status: str) -> None:
        self.text = text
        self.status = status
        self.complete = True
        self.set_class(False, "busy")

    def fail(self, error: str) -> None:
        self.status = f"failed: {error}"
        self.complete = False
        self.set_class(False, "busy")
        self.set_class(True, "failed")

    def clear(self, placeholder: str) -> None:
        self.complete = False
        self.text = ""
        self.status = ""
        self.placeholder = placeholder
        self.set_class(False, "busy", "failed")

    def watch_status(self, status: str) -> None:
        self.border_subtitle = status

    def render(self) -> Text:
        if self.text:
            return Text(self.text)
        return Text(self.placeholder, style="dim italic")
