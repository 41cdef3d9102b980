"""`DraftEditor`: the multi-line text the user wants rewritten (a `TextArea` with the app's defaults).

Tab moves focus on (it does not indent), so every control stays reachable from the keyboard. A paste loses
its control characters other than newline and tab (text copied from a log or a terminal): the editor drew them
as they were, so an escape sequence retitled or recoloured the terminal, and the model was shown them. The app
listens to `TextArea.Changed` for the debounce; this widget does not trigger generation itself.
"""

from __future__ import annotations

from textual import events
from textual.widgets import TextArea

from localpers.tui.text import drop_control_codes

PLACEHOLDER = "Type or paste a text (an article for the headline task), then wait a moment or press ctrl+r."


class PlainTextArea(TextArea):
    """A `TextArea` whose pastes lose their control characters other than newline and tab (see the module
    docstring); the Edit dialog's text is one too."""

    async def _on_paste(self, event: events.Paste) -> None:
        # Textual runs TextArea's own handler after this one unless the default is prevented. Line ends first:
        # VTE terminals and xterm paste a newline as CR, which is a control character to drop
        cleaned = drop_control_codes(event.text.replace("\r\n", "\n").replace("\r", "\n"))
        if cleaned != event.text:
            event.prevent_default()
            await super()._on_paste(events.Paste(cleaned))


class DraftEditor(PlainTextArea):
    """The draft: soft-wrapped plain text, with a placeholder when empty."""

    DEFAULT_CSS = """
    DraftEditor {
        height: 1fr;
        border: round $primary 60%;
        border-title-color: $text;
    }
    DraftEditor:focus {
        border: round $accent;
    }
    """

    def __init__(self, text: str = "", *, id: str | None = None) -> None:
        super().__init__(text, soft_wrap=True, tab_behavior="focus", placeholder=PLACEHOLDER, id=id)

    def on_mount(self) -> None:
        self.border_title = "Draft (F1)"
