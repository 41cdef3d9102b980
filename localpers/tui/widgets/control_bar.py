"""`ControlBar`: the one-line row of controls above the draft: task, method, user, strength α and top-k.

It only holds the widgets and typed accessors to them; the app reacts to their `Select.Changed` and
`Stepper.Changed` messages (told apart by id).
"""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, Select

from localpers.methods.registry import DEFAULT_METHOD, compared_methods, listed
from localpers.tasks import TASKS
from localpers.tui.widgets.stepper import Stepper

STRENGTH_VALUES = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
TOP_K_VALUES = (1, 2, 3, 5, 10, 20, 50, 100)


def format_strength(value: float) -> str:
    return f"{value:.2f}"


def format_top_k(value: float) -> str:
    return str(int(value))


class ControlBar(Horizontal):
    """Task, method and user selectors plus the α and top-k steppers."""

    DEFAULT_CSS = """
    ControlBar {
        height: 1;
        overflow-x: auto;
        scrollbar-size-horizontal: 0;
    }
    ControlBar Label {
        padding: 0 1;
        color: $text-muted;
    }
    ControlBar Select {
        width: 13;
    }
    ControlBar Select:focus > SelectCurrent {
        text-style: bold reverse;
    }
    ControlBar #method {
        width: 11;
    }
    /* what a wider terminal has to spare goes to user names (up to 32 characters): two long ones that share
       their start looked the same at 13 columns */
    ControlBar #user {
        width: 1fr;
        min-width: 13;
        max-width: 38;
    }
    ControlBar Stepper {
        padding: 0 0 0 1;
    }
    """

    def compose(self) -> ComposeResult:
        yield Label("Task")
        yield Select(
            [(name, name) for name in TASKS], value="headline", allow_blank=False, compact=True, id="task"
        )
        yield Label("Method")
        yield Select(
            [(name, name) for name in compared_methods()],
            value=DEFAULT_METHOD,
            allow_blank=False,
            compact=True,
            id="method",
        )
        yield Label("User")
        yield Select([], prompt="(no user)", compact=True, id="user")
        yield Stepper("α", STRENGTH_VALUES, 1.0, formatter=format_strength, id="strength")
        yield Stepper("top-k", TOP_K_VALUES, 10, formatter=format_top_k, id="top-k")

    @property
    def task_select(self) -> Select[str]:
        return self.query_one("#task", Select)

    @property
    def method_select(self) -> Select[str]:
        return self.query_one("#method", Select)

    @property
    def user_select(self) -> Select[str]:
        return self.query_one("#user", Select)

    @property
    def strength(self) -> Stepper:
        return self.query_one("#strength", Stepper)

    @property
    def top_k(self) -> Stepper:
        return self.query_one("#top-k", Stepper)

    @property
    def task(self) -> str:
        return str(self.task_select.value)

    @property
    def method(self) -> str:
        return str(self.method_select.value)

    def set_users(self, names: Sequence[str], current: str | None) -> None:
        """Offer `names`, showing `current` (no message is posted for this programmatic change)."""
        select = self.user_select
        with select.prevent(Select.Changed):
            select.set_options([(name, name) for name in names])
            if current is not None and current in names:
                select.value = current

    def set_methods(self, methods: Sequence[str]) -> None:
        """Offer the methods the loaded bundle supports, keeping the current one when it is among them."""
        select = self.method_select
        current = self.method
        with select.prevent(Select.Changed):
            select.set_options([(name, name) for name in methods])
            select.value = current if current in methods else methods[0]
        self.enable_tuning_for_method()

    def enable_tuning_for_method(self) -> None:
        """α and top-k on for a method the correction's strengths tune (CARD), off for the others."""
        self.set_card_controls_enabled(listed(self.method).tuned)

    def set_card_controls_enabled(self, enabled: bool) -> None:
        """α and top-k only mean something for CARD's correction; disabled, they are skipped by tab."""
        self.strength.disabled = not enabled
        self.top_k.disabled = not enabled
