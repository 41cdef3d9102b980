"""`ProgressStatus`: a one-line label and progress bar for background engine work (loading, fitting).

Hidden while idle. The app feeds it `(stage, done, total)` from the fit's progress callback; stages it
does not know are shown by name. It does not know what the work is.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, ProgressBar

from localpers.methods.reports import FIT_STAGE_LABELS


class ProgressStatus(Horizontal):
    """`label [█████     ] 12/24`; shown only while work runs."""

    DEFAULT_CSS = """
    ProgressStatus {
        height: 1;
        display: none;
        padding: 0 1;
        background: $boost;
    }
    ProgressStatus.running {
        display: block;
    }
    ProgressStatus #progress-label {
        width: auto;
        padding-right: 2;
    }
    ProgressStatus #progress-count {
        width: auto;
        padding-left: 1;
    }
    """

    work_label: str = ""

    def compose(self) -> ComposeResult:
        yield Label("", id="progress-label")
        yield ProgressBar(total=None, show_eta=False, show_percentage=False, id="progress-bar")
        yield Label("", id="progress-count")

    @property
    def label(self) -> Label:
        return self.query_one("#progress-label", Label)

    @property
    def bar(self) -> ProgressBar:
        return self.query_one(ProgressBar)

    @property
    def count(self) -> Label:
        return self.query_one("#progress-count", Label)

    @property
    def running(self) -> bool:
        return self.has_class("running")

    def start(self, label: str) -> None:
        """Show `label` with an indeterminate bar until the first `advance`."""
        self.add_class("running")
        self.label.update(label)
        self.bar.update(total=None, progress=0)
        self.count.update("")
        self.work_label = label

    def advance(self, stage: str, done: int, total: int) -> None:
        self.label.update(f"{self.work_label}: {FIT_STAGE_LABELS.get(stage, stage)}")
        self.bar.update(total=max(total, 1), progress=done)
        self.count.update(f"{done}/{total}")

    def stop(self) -> None:
        self.remove_class("running")
