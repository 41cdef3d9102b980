"""`WhyView`: why the personalized output reads the way it does (your history shown, CARD's corrections).

It lists the history items the prompt showed the model and why each (`history_prompt.ShownExample`), then a
one-line summary, the `TokenStrip` and, for the selected token, the `CandidateTable`. The corrections exist
only for the `card` method; for the others it says so.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from localpers.methods.reports import RewriteResult
from localpers.tui.text import flatten_whitespace
from localpers.tui.widgets.candidate_table import CandidateTable
from localpers.tui.widgets.token_strip import TokenStrip, choice_changed, visible_piece
from localpers.users.history_prompt import ShownExample

EMPTY_HINT = (
    "CARD's token-by-token corrections show here for method card: choose it, write a draft, and select tokens"
    " with ←/→."
)


def summarize(result: RewriteResult) -> str:
    """One line: tokens, choices the vector changed, the largest push, e.g. '12 tokens · 2 choices changed'."""
    steps = result.steps
    changed = sum(choice_changed(step) for step in steps)
    line = f"{len(steps)} tokens · {changed} choice{'' if changed == 1 else 's'} changed by your vector"
    if steps:
        strongest = max(steps, key=lambda s: abs(s.correction))
        line += f" · largest shift {strongest.correction:+.2f} on {visible_piece(strongest.piece)!r}"
    line += f" · α {result.strength:.3g}, top-{result.top_k}" if result.strength is not None else ""
    return line


WHY_SHOWN = {
    "recent": "one of your latest",
    "closest": "closest to this text",
    "series": "a series you repeat",
}


def shown_text(examples: list[ShownExample]) -> Text:
    """The history items a prompt showed, one line each with why, ending in an ellipsis at the widget's width
    (a long one must not push the tokens out of the tab; user text is never read as markup)."""
    text = Text(f"Your history shown to the model ({len(examples)}):", style="bold")
    for example in examples:
        why = WHY_SHOWN.get(example.why, example.why) + (", with its text" if example.described else "")
        text.append(f"\n  {why:<22} ", style="dim")
        text.append(flatten_whitespace(example.output))
    return text


class WhyView(Vertical):
    """Summary, coloured tokens and the candidate table of the selected token."""

    DEFAULT_CSS = """
    WhyView {
        height: auto;
    }
    WhyView #why-examples {
        padding: 0 1 1 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    WhyView #why-summary {
        color: $text-muted;
        padding: 0 1;
    }
    WhyView #why-legend {
        color: $text-muted;
        padding: 0 1;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.result: RewriteResult | None = None

    def compose(self) -> ComposeResult:
        examples = Static(id="why-examples")
        examples.display = False
        yield examples
        yield Static(EMPTY_HINT, id="why-summary")
        yield TokenStrip()
        yield Static(
            # white on the chips: the legend's muted grey read at 2.3:1 on them
            "[bold white on rgb(24,150,72)] pushed up [/] [italic white on rgb(190,48,48)] pushed down [/] "
            "[underline]underlined[/]: the vector changed the choice",
            id="why-legend",
        )
        yield CandidateTable()

    @property
    def strip(self) -> TokenStrip:
        return self.query_one(TokenStrip)

    @property
    def table(self) -> CandidateTable:
        return self.query_one(CandidateTable)

    @property
    def summary(self) -> Static:
        return self.query_one("#why-summary", Static)

    @property
    def examples(self) -> Static:
        return self.query_one("#why-examples", Static)

    def show(self, result: RewriteResult | None) -> None:
        """Explain `result`: the history it was shown, and CARD's corrections (None clears the view)."""
        self.result = result
        shown = result.examples if result is not None else []
        self.examples.display = bool(shown)
        self.examples.update(shown_text(shown) if shown else "")
        if result is None or not result.steps:
            self.summary.update(EMPTY_HINT)
            self.strip.steps = []
            self.table.show(None)
            return
        self.summary.update(summarize(result))
        self.strip.show(result.steps)

    def on_token_strip_selected(self, message: TokenStrip.Selected) -> None:
        message.stop()
        if self.result is not None and 0 <= message.index < len(self.result.steps):
            self.table.show(self.result.steps[message.index])
