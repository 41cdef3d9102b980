"""`MainScreen`: the layout of the app's one working screen, with typed accessors to its widgets.

Controls on top; the draft on the left; the non-personalized and personalized outputs on the right; the
Why, History and Profile tabs below; a progress line and the footer. All behaviour lives in the app.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Header, TabbedContent, TabPane

from localpers.tui.widgets.control_bar import ControlBar
from localpers.tui.widgets.draft_editor import DraftEditor
from localpers.tui.widgets.history_panel import HistoryPanel
from localpers.tui.widgets.key_footer import KeyFooter
from localpers.tui.widgets.output_panel import OutputPanel
from localpers.tui.widgets.profile_panel import ProfilePanel
from localpers.tui.widgets.progress_status import ProgressStatus
from localpers.tui.widgets.why_view import WhyView

BASELINE_TITLE = "Non-personalized · global adapter"
TAB_SCROLLERS = ("why-scroll", "profile-scroll")  # the containers that scroll the Why and Profile tabs


class MainScreen(Screen[None]):
    """Write, compare, explain, teach."""

    def __init__(self, initial_text: str = "") -> None:
        super().__init__()
        self.initial_text = initial_text

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="✎")
        yield ControlBar()
        with Horizontal(id="write-area"):
            yield DraftEditor(self.initial_text, id="draft")
            with Vertical(id="outputs"):
                yield OutputPanel(BASELINE_TITLE, id="baseline")
                yield OutputPanel("Personalized", id="personal", classes="personal")
        with TabbedContent(id="panels", initial="why-tab"):
            with TabPane("Why (F2)", id="why-tab"), VerticalScroll(id=TAB_SCROLLERS[0]):
                yield WhyView()
            with TabPane("History (F3)", id="history-tab"):
                yield HistoryPanel()
            with TabPane("Profile (F4)", id="profile-tab"), VerticalScroll(id=TAB_SCROLLERS[1]):
                yield ProfilePanel()
        yield ProgressStatus()
        yield KeyFooter()

    @property
    def controls(self) -> ControlBar:
        return self.query_one(ControlBar)

    @property
    def draft(self) -> DraftEditor:
        return self.query_one(DraftEditor)

    @property
    def baseline_panel(self) -> OutputPanel:
        return self.query_one("#baseline", OutputPanel)

    @property
    def personal_panel(self) -> OutputPanel:
        return self.query_one("#personal", OutputPanel)

    @property
    def tabs(self) -> TabbedContent:
        return self.query_one("#panels", TabbedContent)

    @property
    def why(self) -> WhyView:
        return self.query_one(WhyView)

    @property
    def history_panel(self) -> HistoryPanel:
        return self.query_one(HistoryPanel)

    @property
    def profile_panel(self) -> ProfilePanel:
        return self.query_one(ProfilePanel)

    @property
    def progress(self) -> ProgressStatus:
        return self.query_one(ProgressStatus)

    def panel(self, target: str) -> OutputPanel:
        """The output panel fed by a run's target ("baseline" or "personal")."""
        return self.baseline_panel if target == "baseline" else self.personal_panel
