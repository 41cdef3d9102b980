"""Text fitting for the TUI: cut a string to a column's width, make outside text safe to draw (no markup, no
terminal control codes), and a colour that reads on a background. Knows nothing of widgets."""

from __future__ import annotations

from rich.text import Text
from textual.color import Color

from localpers.users.history import CONTROL_CHARACTERS


def shorten(text: str, width: int) -> str:
    """`text`, or its first `width - 1` characters and an ellipsis when it is longer than `width`."""
    return text if len(text) <= width else text[: width - 1] + "…"


def without_control_codes(text: str) -> str:
    """`text` with C0 and C1 control characters other than newline and tab as visible stand-ins (ESC as ␛):
    Rich passes ESC through, so a draft, a model's output or a file's text could retitle or recolour the
    terminal, or reach its clipboard (OSC 52)."""
    if text.isprintable():
        return text
    return "".join(_STAND_INS.get(ord(character), character) for character in text)


_STAND_INS = {
    **{code: chr(0x2400 + code) for code in range(0x20) if code not in (0x09, 0x0A)},  # ␀ ... ␟
    0x7F: "\u2421",  # ␡
    **{code: "\ufffd" for code in range(0x80, 0xA0)},  # C1: no picture of their own
}


def drop_control_codes(text: str) -> str:
    """`text` without the C0 and C1 control characters other than newline and tab, nor line separators (a `--text`
    from a log file: its escape codes are no one's writing, and the model would see them)."""
    return CONTROL_CHARACTERS.sub("", text)  # what a history import removes too


def plain(text: str) -> Text:
    """`text` to draw as it is: never read as Textual markup (`[/s]` in a headline raised MarkupError, `[b]`
    turned bold, `[@click=app.quit]` became a link) and without control codes."""
    return Text(without_control_codes(text))


def flatten_whitespace(text: str) -> str:
    """`text` with every run of whitespace (newlines included) as one space."""
    return " ".join(text.split())


READABLE_CONTRAST = 4.5  # WCAG AA for text


def contrast_ratio(foreground: Color, background: Color) -> float:
    """The WCAG contrast ratio of two colours (1 to 21)."""

    def luminance(color: Color) -> float:
        def channel(value: int) -> float:
            share = value / 255
            return share / 12.92 if share <= 0.03928 else ((share + 0.055) / 1.055) ** 2.4

        return 0.2126 * channel(color.r) + 0.7152 * channel(color.g) + 0.0722 * channel(color.b)

    lighter, darker = sorted((luminance(foreground), luminance(background)), reverse=True)
    return (lighter + 0.05) / (darker + 0.05)


def readable_on(color: str, background: str) -> str:
    """`color` (hex) darkened on a light background or lightened on a dark one until it reads at 4.5:1 there: a
    theme's warning yellow, say, on the light theme."""
    wanted, ground = Color.parse(color), Color.parse(background)
    light_ground = ground.brightness > 0.5
    for step in range(21):
        shade = wanted.darken(step / 20) if light_ground else wanted.lighten(step / 20)
        if contrast_ratio(shade, ground) >= READABLE_CONTRAST:
            return shade.hex6
    return "#000000" if light_ground else "#ffffff"
