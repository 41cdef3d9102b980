"""`EditAcceptScreen`: edit the personalized output before accepting it into the history.

ctrl+s hands the edited text to the app's `accept` callback, which adds it to the history or returns why not;
the dialog closes (with the accepted text) only once it was accepted, and shows the reason otherwise, keeping
the edit. escape dismisses with None, after asking when the text was edited (the edit would be lost).
"""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static, TextArea

from localpers.tui.screens.confirm import ConfirmScreen
from localpers.tui.text import drop_control_codes
from localpers.tui.widgets.draft_editor import PlainTextArea
from localpers.tui.widgets.key_footer import KeyFooter


class EditAcceptScreen(ModalScreen[str | None]):
    """A text area holding the output; the edited text is what gets accepted."""

    DEFAULT_CSS = """
    EditAcceptScreen {
        align: center middle;
    }
    EditAcceptScreen > Vertical {
        width: 90;
        max-width: 100%;
        height: auto;
        max-height: 100%;
        overflow-y: auto;
        border: thick $success;
        background: $surface;
        padding: 1 2;
    }
    EditAcceptScreen TextArea {
        height: 8;
    }
    EditAcceptScreen #edit-error {
        color: $text-error;
    }
    """

    BINDINGS = [
        Binding("ctrl+s", "accept", "Accept", priority=True),
        Binding("escape", "cancel", "Cancel"),
    ]

    def __init__(self, text: str, accept: Callable[[str], str | None]) -> None:
        super().__init__()
        # the output as the panel draws it: a control code the model wrote reached the terminal raw from here
        self.initial_text = drop_control_codes(text)
        self.accept = accept  # adds the text to the history; the one-line reason when refused

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("[b]Edit, then accept[/b] (ctrl+s accepts, esc cancels)")
            yield PlainTextArea(self.initial_text, soft_wrap=True, tab_behavior="focus", id="edit-text")
            yield Static("", id="edit-error")
        yield KeyFooter()

    @property
    def editor(self) -> TextArea:
        return self.query_one("#edit-text", TextArea)

    def on_mount(self) -> None:
        self.editor.focus()
        self.editor.move_cursor(self.editor.document.end)

    def action_accept(self) -> None:
        error = self.query_one("#edit-error", Static)
        if not self.editor.text.strip():
            error.update("the text is empty; write something or cancel")
            return
        problem = self.accept(self.editor.text)
        if problem is not None:
            error.update(Text(problem))  # literal: the reason may quote the user's text
            return
        self.dismiss(self.editor.text)

    def action_cancel(self) -> None:
        if self.editor.text == self.initial_text:
            self.dismiss(None)
            return

        def answered(discard: bool | None) -> None:
            if discard:
                self.dismiss(None)

        self.app.push_screen(
            ConfirmScreen("Discard your edit? It is not accepted or kept anywhere."), answered
        )
