"""`WelcomeScreen`: the first-run choice when this device has no user yet.

It offers the shipped demo user (fitted on first use) or importing a history file, and dismisses with
"demo", "import" or "quit"; the app carries the choice out.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from localpers.tui.widgets.key_footer import KeyFooter

WELCOME_TEXT = (
    "[b]Welcome to localpers[/b]\n\n"
    "localpers rewrites your drafts (headlines, titles, paraphrases) the way [i]you[/i] write, learned from "
    "examples of your own writing. Everything stays on this machine.\n\n"
    "There is no user on this device yet. Start with the demo user (an invented, pun-loving headline writer, "
    "fitted now: from a few seconds to a minute), or import a file of your own examples: JSONL lines like "
    '[dim]{"input": "the article…", "output": "your headline"}[/dim].'
)


class WelcomeScreen(ModalScreen[str]):
    """Demo user, import, or quit."""

    DEFAULT_CSS = """
    WelcomeScreen {
        align: center middle;
    }
    WelcomeScreen > Vertical {
        width: 84;
        max-width: 100%;
        height: auto;
        max-height: 100%;
        overflow-y: auto;
        border: thick $primary;
        background: $surface;
        padding: 1 2;
    }
    WelcomeScreen Horizontal {
        height: auto;
        margin-top: 1;
    }
    WelcomeScreen Button {
        margin-right: 2;
    }
    """

    BINDINGS = [
        Binding("d", "choose('demo')", "Demo user"),
        Binding("i", "choose('import')", "Import a file"),
        Binding("escape,q", "choose('quit')", "Quit"),
    ]

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(WELCOME_TEXT)
            with Horizontal():
                yield Button("Use the demo user (d)", id="demo", variant="primary")
                yield Button("Import my history… (i)", id="import")
                yield Button("Quit (q)", id="quit", variant="error")
        yield KeyFooter()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id:
            self.dismiss(event.button.id)

    def action_choose(self, choice: str) -> None:
        self.dismiss(choice)
