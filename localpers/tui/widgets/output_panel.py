"""`OutputPanel`: one generated output, streamed in piece by piece, with a status line under it.

The app sets `title` (which method produced it), calls `begin` when a generation starts, `append` for each
streamed piece and `finish`/`fail` at the end. The panel keeps the text and scrolls it when it is longer than
the panel, following a stream to its end unless the reader scrolled up; it takes focus (Tab), so a keyboard
alone scrolls it (arrows, Page Up/Down, Home/End), its border doubled while focused. It never generates anything.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.css.query import NoMatches
from textual.reactive import reactive
from textual.widgets import Static

from localpers.tui.text import plain, without_control_codes


class OutputPanel(VerticalScroll, can_focus=True):
    """A bordered block of generated text; the border subtitle says whether it is complete."""

    DEFAULT_CSS = """
    OutputPanel {
        height: 1fr;
        border: round $secondary;
        border-title-color: $text;
        padding: 0 1;
    }
    OutputPanel:focus {
        border: double $accent;
    }
    OutputPanel > .output-text {
        height: auto;
    }
    OutputPanel.personal {
        border: round $success;
        /* the border says "personal"; its words in $text (contrast chosen by Textual): green read at 1.8:1 on the
           light theme */
        border-title-color: $text;
        border-subtitle-color: $text;
    }
    OutputPanel.personal:focus {
        border: double $accent;
    }
    OutputPanel.busy {
        border-subtitle-color: $text;
        border-subtitle-style: italic;
    }
    OutputPanel.failed {
        border: round $error;  /* the border shows the state; its words stay readable on either theme */
        border-subtitle-color: $text;
        border-subtitle-style: bold;
    }
    """

    text: reactive[str] = reactive("")
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
        self.placeholder = ""  # not the last failure's reason or the empty draft's hint: the status says it
        self.status = status
        self.set_class(True, "busy")
        self.set_class(False, "failed")

    def append(self, piece: str) -> None:
        following = self.scroll_y >= self.max_scroll_y  # at the end: keep up; scrolled up: stay put
        self.text += piece
        if following:
            self.scroll_end(animate=False)

    def finish(self, text: str, status: str) -> None:
        self.text = text
        self.status = status
        self.complete = True
        self.set_class(False, "busy")

    def fail(self, error: str) -> None:
        self.status = f"failed: {error}"
        self.complete = False
        self.text = ""
        # the whole reason, wrapped, in the body: the border's subtitle is cut at the panel's width
        self.placeholder = error
        self.set_class(False, "busy")
        self.set_class(True, "failed")

    def clear(self, placeholder: str) -> None:
        self.complete = False
        self.text = ""
        self.status = ""
        self.placeholder = placeholder
        self.set_class(False, "busy", "failed")

    def watch_status(self, status: str) -> None:
        # an error quoting "[/i]" from a file was read as markup: a crash
        self.border_subtitle = plain(status)

    def compose(self) -> ComposeResult:
        yield Static(classes="output-text")

    def on_mount(self) -> None:
        self._show()

    def watch_text(self) -> None:
        self._show()

    def watch_placeholder(self) -> None:
        self._show()

    def _show(self) -> None:
        try:
            body = self.query_one(".output-text", Static)
        except NoMatches:  # not composed yet: on_mount shows it
            return
        body.update(
            plain(self.text)
            if self.text
            else Text(without_control_codes(self.placeholder), style="dim italic")
        )
