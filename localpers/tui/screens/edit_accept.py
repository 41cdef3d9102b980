"""`EditAcceptScreen`: edit the personalized output before accepting it into the history.

ctrl+s dismisses with the edited text, escape with None. Accepting is the app's job.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static, TextArea


class EditAcceptScreen(ModalScreen[str | None]):
    """A text area holding the output; the edited text is what gets accepted."""

    DEFAULT_CSS = """
    EditAcceptScreen {
        align: center middle;
    }
    EditAcceptScreen > Vertical {
        width: 90;
        height: auto;
        max-height: 24;
        border: thick $success;
        background: $surface;
        padding: 1 2;
    }
    EditAcceptScreen TextArea {
        height: 8;
    }
    EditAcceptScreen #edit-error {
        color: $error;
    }
    """

    BINDINGS = [
        Binding("ctrl+s", "accept", "Accept", priority=True),
        Binding("escape", "cancel", "Cancel"),
    ]

    def __init__(self, text: str) -> None:
        super().__init__()
        self.initial_text = text

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("[b]Edit, then accept[/b] (ctrl+s accepts, esc cancels)")
            yield TextArea(self.initial_text, soft_wrap=True, tab_behavior="focus", id="edit-text")
            yield Static("", id="edit-error")

    @property
    def editor(self) -> TextArea:
        return self.query_one("#edit-text", TextArea)

    def on_mount(self) -> None:
        self.editor.focus()
        self.editor.move_cursor(self.editor.document.end)

    def action_accept(self) -> None:
        if not self.editor.text.strip():
            self.query_one("#edit-error", Static).update("the text is empty; write something or cancel")
            return
        self.dismiss(self.editor.text)

    def action_cancel(self) -> None:
        self.dismiss(None)
