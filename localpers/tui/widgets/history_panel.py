"""`HistoryPanel`: the user's history items (newest first) in a table; `x`/delete asks to remove one.

The panel only displays items and posts `HistoryPanel.RemoveRequested`; the app confirms, removes the item
from the user's folder and refreshes the panel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from localpers.tasks import TASKS
from localpers.tui.text import flatten_whitespace, plain, shorten
from localpers.users.history import HistoryItem


class HistoryTable(DataTable[str]):
    """The table of items; its row keys are item ids."""

    BINDINGS = [
        Binding("x,delete", "remove", "Remove", show=True),  # short: 80 columns show the main keys too
        # DataTable's home/end scroll sideways, which a table of rows never needs: first and last item instead
        Binding("home", "scroll_top", "First item", show=False),
        Binding("end", "scroll_bottom", "Last item", show=False),
    ]

    def action_remove(self) -> None:
        if self.row_count == 0:
            return
        row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        if row_key.value is not None:
            self.post_message(HistoryPanel.RemoveRequested(row_key.value))


class HistoryPanel(Vertical):
    """A caption and the table of the current user's history items."""

    DEFAULT_CSS = """
    HistoryPanel {
        height: 1fr;
    }
    HistoryPanel #history-caption {
        color: $text-muted;
        padding: 0 1;
    }
    HistoryPanel HistoryTable {
        height: 1fr;
    }
    """

    @dataclass
    class RemoveRequested(Message):
        item_id: str

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.items: list[HistoryItem] = []
        self.user: str | None = None  # whose items the table shows

    def compose(self) -> ComposeResult:
        yield Static("No user yet.", id="history-caption")
        yield HistoryTable(cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self.table.add_columns("id", "task", "your text", "for")

    @property
    def table(self) -> HistoryTable:
        return self.query_one(HistoryTable)

    @property
    def caption(self) -> Static:
        return self.query_one("#history-caption", Static)

    def _selected(self) -> tuple[str, int] | None:
        """The selected row's item id and row number, or None (an empty table)."""
        table = self.table
        if not table.row_count:
            return None
        row = table.cursor_row
        return str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value), row

    def show(self, user: str | None, items: Sequence[HistoryItem]) -> None:
        """Show `user`'s items, newest first; the same user's selected row stays selected (or, removed, the row
        now in its place): a refresh the user did not ask for (a refit's end, another command's change) put the
        cursor on the newest item, which `x` then offered to remove."""
        table = self.table
        selected = self._selected() if user is not None and user == self.user else None
        self.items, self.user = list(items), user
        table.clear()
        if user is None:
            self.caption.update("No user yet.")
            return
        for item in reversed(self.items):
            # plain Text cells: a str cell is read as markup, and a headline ending "[/s]" ended the app
            table.add_row(
                plain(item.id),
                plain(item.task),
                plain(shorten(flatten_whitespace(item.output), 60)),
                plain(
                    shorten(flatten_whitespace(TASKS[item.task].content(item.input)), 70)
                ),  # no instruction
                key=item.id,
            )
        if selected is not None and table.row_count:
            item_id, row = selected
            kept = next(
                (index for index, item in enumerate(reversed(self.items)) if item.id == item_id), None
            )
            table.move_cursor(row=kept if kept is not None else min(row, table.row_count - 1), animate=False)
        count = f"{len(self.items)} item{'' if len(self.items) == 1 else 's'}"
        self.caption.update(
            f"{user}: {count}, newest first. ctrl+s adds the current output; x removes the selected item."
        )
