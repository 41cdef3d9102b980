"""`Stepper`: a one-line, focusable picker over a fixed list of values (strength α, top-k).

Left/right (or -/+) move to the previous/next value and post `Stepper.Changed`. It knows nothing about
what the value means.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

_LESS_OR_MORE = Binding.Group("Adjust", compact=True)


class Stepper(Widget, can_focus=True):
    """`label ‹ value ›`; the value is one of `values`, chosen with the arrow keys; `label off` while disabled."""

    DEFAULT_CSS = """
    Stepper {
        width: auto;
        height: 1;
    }
    Stepper:focus {
        background: $accent 40%;
        text-style: bold;
    }
    Stepper:disabled {
        color: $text-disabled;
    }
    """

    BINDINGS = [
        # one footer entry for both directions ("←→ Adjust"), so 80 columns still show the main screen's keys
        Binding("left,minus", "step(-1)", "Less", show=True, group=_LESS_OR_MORE),
        Binding("right,plus,equals_sign", "step(1)", "More", show=True, group=_LESS_OR_MORE),
    ]

    index: reactive[int] = reactive(0)

    @dataclass
    class Changed(Message):
        stepper: Stepper
        value: float

        @property
        def control(self) -> Stepper:
            return self.stepper

    def __init__(
        self,
        label: str,
        values: Sequence[float],
        value: float,
        *,
        formatter: Callable[[float], str] = str,
        id: str | None = None,
    ) -> None:
        super().__init__(id=id)
        if not values:
            raise ValueError("a Stepper needs at least one value")
        self.label = label
        self.values: list[float] = sorted(set(values))
        self.formatter = formatter
        self.set_reactive(Stepper.index, self._nearest(value))

    @property
    def value(self) -> float:
        return self.values[self.index]

    def set_value(self, value: float, *, add: bool = True) -> None:
        """Select `value`; when it is not one of the values it is added (`add`) or the nearest is taken."""
        if add and value not in self.values:
            current = self.value
            self.values = sorted({*self.values, value})
            self.set_reactive(Stepper.index, self.values.index(current))
        self.index = self._nearest(value)

    def _nearest(self, value: float) -> int:
        return min(range(len(self.values)), key=lambda i: abs(self.values[i] - value))

    def action_step(self, delta: int) -> None:
        self.index = max(0, min(len(self.values) - 1, self.index + delta))

    def watch_index(self, old: int, new: int) -> None:
        if old != new:
            self.post_message(self.Changed(self, self.value))

    def render(self) -> Text:
        if self.disabled:  # said in words, not only by the dimmer colour (the value does not apply)
            return Text.assemble((f"{self.label} ", "dim"), ("off", "dim italic"))
        left = "‹" if self.index > 0 else " "
        right = "›" if self.index < len(self.values) - 1 else " "
        return Text.assemble((f"{self.label} ", "dim"), f"{left}{self.formatter(self.value)}{right}")
