"""`CandidateTable`: for one decoding step, the top candidates' logits before and after the correction.

Rows are sorted by the corrected logit (the order CARD decides in); `rank before` shows where the cluster
model alone had put each token, so a correction that changed the choice is visible at a glance.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from localpers.methods.reports import RewriteStep
from localpers.tui.text import shorten
from localpers.tui.widgets.token_strip import visible_piece

MAX_ROWS = 10
TOKEN_WIDTH = 16
# Fixed widths: DataTable widens auto-width columns only when idle and keeps rows it drew before that, so auto widths
# would depend on which steps were shown before and on timing; fixed ones also keep the table still while stepping.
COLUMNS = (("", 1), ("token", TOKEN_WIDTH), ("before", 7), ("after", 7), ("shift", 7), ("rank before", 11))


class CandidateTable(DataTable[object]):
    """Top candidates of the selected step: token, logit before, after, shift, rank before."""

    DEFAULT_CSS = """
    CandidateTable {
        height: auto;
        max-height: 12;
    }
    """

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for label, width in COLUMNS:
            self.add_column(label, width=width)

    def show(self, step: RewriteStep | None) -> None:
        self.clear()
        if step is None:
            return
        ranked_before = sorted(step.candidates, key=lambda c: -c.before)
        rank_before = {c.token: rank for rank, c in enumerate(ranked_before, start=1)}
        for candidate in step.candidates[:MAX_ROWS]:
            shift = candidate.after - candidate.before
            chosen = candidate.token == step.token
            shift_style = "green" if shift > 0 else ("red" if shift < 0 else "")
            self.add_row(
                Text("▶", style="bold") if chosen else "",
                Text(
                    shorten(repr(visible_piece(candidate.piece)), TOKEN_WIDTH), style="bold" if chosen else ""
                ),
                f"{candidate.before:7.2f}",
                f"{candidate.after:7.2f}",
                Text(f"{shift:+7.2f}", style=shift_style),
                str(rank_before[candidate.token]),
            )
