"""`TokenStrip`: the personalized output as tokens, each coloured by how much the user vector moved it.

The colour is the correction CARD added to the chosen token's logit: green when the user's vector pushed
it up, red when it pushed it down, stronger for larger shifts (scaled by the largest shift in the text); a
clear push is also bold (up) or italic (down), so the sign survives a terminal without colour (NO_COLOR).
Tokens whose choice the correction changed (not the cluster model's own first choice) are underlined.
Left/right move the selection and post `TokenStrip.Selected`; the strip does not compute corrections.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

from localpers.methods.reports import RewriteStep
from localpers.tui.text import without_control_codes

NEUTRAL = (48, 48, 56)
PUSHED_UP = (24, 150, 72)
PUSHED_DOWN = (190, 48, 48)
MARKED_SHARE = 0.2  # a push of at least this share of the text's largest is also bold (up) or italic (down)


def correction_color(correction: float, scale: float) -> str:
    """Background colour for a token's correction, e.g. correction_color(1.0, 1.0) -> 'rgb(24,150,72)'."""
    if scale <= 0 or correction == 0:
        return "rgb({},{},{})".format(*NEUTRAL)
    weight = min(1.0, abs(correction) / scale)
    target = PUSHED_UP if correction > 0 else PUSHED_DOWN
    mixed = (round(n + (t - n) * weight) for n, t in zip(NEUTRAL, target, strict=True))
    return "rgb({},{},{})".format(*mixed)


def choice_changed(step: RewriteStep) -> bool:
    """True when the chosen token was not the top candidate before the correction."""
    if not step.candidates:
        return False
    best_before = max(step.candidates, key=lambda c: c.before)
    return best_before.token != step.token


def visible_piece(piece: str) -> str:
    """The piece as shown in the strip: newlines as ⏎, an empty piece as ∅."""
    if not piece:
        return "∅"
    return without_control_codes(piece.replace("\n", "⏎"))


_ARROWS = Binding.Group("Token", compact=True)


class TokenStrip(Widget, can_focus=True):
    """The chosen tokens in order, coloured by correction, one of them selected."""

    DEFAULT_CSS = """
    TokenStrip {
        height: auto;
        min-height: 1;
        padding: 0 1;
    }
    TokenStrip:focus {
        background: $boost;
        padding: 0 1 0 0;
        border-left: outer $accent;
    }
    """

    BINDINGS = [
        # one footer entry for both arrows ("←→ Token"), so 80 columns still show the main screen's keys
        Binding("left", "move(-1)", "Previous", show=True, group=_ARROWS),
        Binding("right", "move(1)", "Next", show=True, group=_ARROWS),
        Binding("home", "jump(0)", "First", show=False),
        Binding("end", "jump(-1)", "Last", show=False),
    ]

    steps: reactive[list[RewriteStep]] = reactive(list, always_update=True, layout=True)
    selected: reactive[int] = reactive(0)

    @dataclass
    class Selected(Message):
        strip: TokenStrip
        index: int

    def show(self, steps: Sequence[RewriteStep]) -> None:
        """Display `steps` and select the token the correction moved most."""
        self.steps = list(steps)
        strongest = max(range(len(steps)), key=lambda i: abs(steps[i].correction), default=0)
        self.selected = strongest
        self.post_message(self.Selected(self, strongest))

    @property
    def scale(self) -> float:
        return max((abs(step.correction) for step in self.steps), default=0.0)

    def action_move(self, delta: int) -> None:
        if self.steps:
            self.selected = (self.selected + delta) % len(self.steps)

    def action_jump(self, index: int) -> None:
        if self.steps:
            self.selected = index % len(self.steps)

    def watch_selected(self, index: int) -> None:
        if self.steps:
            self.post_message(self.Selected(self, index))

    def render(self) -> Text:
        if not self.steps:
            return Text("no tokens yet", style="dim italic")
        scale = self.scale
        text = Text()
        for index, step in enumerate(self.steps):
            style = f"#f0f0f0 on {correction_color(step.correction, scale)}"
            if scale > 0 and abs(step.correction) >= MARKED_SHARE * scale:  # the sign without colour too
                style += " bold" if step.correction > 0 else " italic"
            if choice_changed(step):
                style += " underline"
            if index == self.selected:
                style = f"reverse {style}"  # not bold: bold says "pushed up"
            text.append(visible_piece(step.piece), style=style)
        return text
