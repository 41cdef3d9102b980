"""`ConfirmScreen`: a yes/no question; dismisses with True (y) or False (n/escape).

Enter answers nothing: every question here guards something that cannot be undone (a removal, quitting with a
draft), and Enter is pressed by habit.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from localpers.tui.widgets.key_footer import KeyFooter


class ConfirmScreen(ModalScreen[bool]):
    DEFAULT_CSS = """
    ConfirmScreen {
        align: center middle;
    }
    ConfirmScreen > Vertical {
        width: 70;
        max-width: 100%;
        height: auto;
        max-height: 100%;
        overflow-y: auto;
        border: thick $warning;
        background: $surface;
        padding: 1 2;
    }
    """

    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.question, markup=False)  # it may quote the user's text
            yield Static("[b]y[/b] yes   [b]n[/b] no", classes="hint")
        yield KeyFooter()

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)
