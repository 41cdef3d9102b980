"""`ImportScreen`: import a history file into a (new or existing) user, with errors shown in place.

On success it dismisses with the `ImportSummary`; escape dismisses with None. A bad file or name shows the
one-line error under the fields and changes nothing.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from localpers.errors import LocalpersError
from localpers.tui.text import plain
from localpers.tui.userdata import ImportSummary, import_history_file
from localpers.tui.widgets.key_footer import KeyFooter
from localpers.users.store import UserStore

IMPORT_HELP = (
    'A JSONL file of your examples, one per line: {"input": ..., "output": ...} '
    '(optionally with "task"), or a per-user file of the shared data format.'
)


class ImportScreen(ModalScreen[ImportSummary | None]):
    """Path and user name fields; enter imports."""

    DEFAULT_CSS = """
    ImportScreen {
        align: center middle;
    }
    ImportScreen > Vertical {
        width: 84;
        max-width: 100%;
        height: auto;
        max-height: 100%;
        overflow-y: auto;
        border: thick $primary;
        background: $surface;
        padding: 1 2;
    }
    ImportScreen Input {
        margin-bottom: 1;
    }
    ImportScreen #import-error {
        color: $text-error;
        height: auto;
    }
    ImportScreen Horizontal {
        height: auto;
    }
    ImportScreen Button {
        margin-right: 2;
    }
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, store: UserStore, user_name: str | None) -> None:
        super().__init__()
        self.store = store
        self.default_user = user_name or "me"

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("[b]Import a history file[/b]")
            yield Static(IMPORT_HELP)
            yield Label("File")
            yield Input(placeholder="path/to/history.jsonl", id="import-path")
            yield Label("Into user (created if new)")
            yield Input(self.default_user, id="import-user")
            yield Static("", id="import-error")
            with Horizontal():
                yield Button("Import", id="import-go", variant="primary")
                yield Button("Cancel (esc)", id="import-cancel")
        yield KeyFooter()

    @property
    def path_input(self) -> Input:
        return self.query_one("#import-path", Input)

    @property
    def user_input(self) -> Input:
        return self.query_one("#import-user", Input)

    @property
    def error(self) -> Static:
        return self.query_one("#import-error", Static)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if event.input is self.path_input and not self.user_input.value.strip():
            self.user_input.focus()
            return
        self.run_import()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "import-go":
            self.run_import()
        else:
            self.dismiss(None)

    def run_import(self) -> None:
        path = self.path_input.value.strip()
        name = self.user_input.value.strip()
        if not path:
            self.error.update("give the path of a JSONL file")
            self.path_input.focus()
            return
        if "\x00" in path:  # os.stat raised ValueError: a crash
            self.error.update("the path holds a NUL character; give the path of a JSONL file")
            return
        try:
            summary = import_history_file(self.store, name, path)
        except LocalpersError as exc:
            # never markup: a path "[@click=app.quit]" was a link that quit
            self.error.update(plain(str(exc)))
            return
        self.dismiss(summary)

    def action_cancel(self) -> None:
        self.dismiss(None)
