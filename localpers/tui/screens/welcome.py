"""`WelcomeScreen`: the first-run choice when this device has no user yet.

It offers the shipped demo user (fitted on first use) or importing a history file, and dismisses with
"demo", "import" or "quit"; the app carries the choice out.
"""

from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
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

NARROW_BELOW = 80  # columns: below this the buttons stack, one line each


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
        border: thick $primary;
        background: $surface;
        padding: 1 2;
    }
    /* On a short terminal the text scrolls (tab reaches it, arrows scroll it) and the buttons stay in view. */
    WelcomeScreen #welcome-text {
        height: auto;
        max-height: 100%;
    }
    WelcomeScreen #welcome-text:focus {
        border-left: outer $accent;
    }
    WelcomeScreen Horizontal {
        dock: bottom;
        height: auto;
        margin-top: 1;
    }
    WelcomeScreen Button {
        margin-right: 2;
    }
    /* Below 80 columns the buttons stack, one line each (d, i and q still choose from anywhere). */
    WelcomeScreen.narrow Horizontal {
        layout: vertical;
        margin-top: 0;
    }
    """

    AUTO_FOCUS = "#demo"  # enter takes the demo user; shift+tab reaches the text

    BINDINGS = [
        Binding("d", "choose('demo')", "Demo user"),
        Binding("i", "choose('import')", "Import a file"),
        Binding("escape,q", "choose('quit')", "Quit"),
    ]

    def compose(self) -> ComposeResult:
        with Vertical():
            with VerticalScroll(id="welcome-text"):
                yield Static(WELCOME_TEXT)
            with Horizontal():
                yield Button("Use the demo user (d)", id="demo", variant="primary")
                yield Button("Import my history… (i)", id="import")
                yield Button("Quit (q)", id="quit", variant="error")
        yield KeyFooter()

    def on_resize(self, event: events.Resize) -> None:
        narrow = event.size.width < NARROW_BELOW
        self.set_class(narrow, "narrow")
        for button in self.query(Button):
            button.compact = narrow

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id:
            self.dismiss(event.button.id)

    def action_choose(self, choice: str) -> None:
        self.dismiss(choice)
