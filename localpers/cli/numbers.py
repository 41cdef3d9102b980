"""Float options that must be finite numbers in a range.

Typer accepts `inf`, `1e999` and `nan` for a float option: its min/max check lets `inf` through an option
without a maximum and words `nan` as out of range. `float_option` parses the value itself: a non-finite or
out-of-range number is a usage error (exit 2) that names the option and its range, and `--help` shows the
range that check applies.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import typer


class OptionValueError(typer.BadParameter):
    """A bad option value whose message already names the option (Typer would prefix "Invalid value for")."""

    def format_message(self) -> str:
        return self.message


def range_words(low: float | None, high: float | None, *, low_open: bool = False) -> str:
    """The range in words: "from 0 to 10", "above 0 and at most 10", "of 0 or more"."""
    if low is not None and high is not None:
        return f"above {low:g} and at most {high:g}" if low_open else f"from {low:g} to {high:g}"
    if low is not None:
        return f"above {low:g}" if low_open else f"of {low:g} or more"
    return "" if high is None else f"of {high:g} or less"


def finite_float(
    option: str, low: float | None = None, high: float | None = None, *, low_open: bool = False
) -> Callable[[Any], float]:
    """A parser for `option`'s value: a finite float in the range, else an `OptionValueError` naming both."""
    rule = range_words(low, high, low_open=low_open)

    def parse(raw: Any) -> float:
        try:
            value = float(raw)
        except (TypeError, ValueError):
            value = math.nan
        below = low is not None and (value <= low if low_open else value < low)
        if not math.isfinite(value) or below or (high is not None and value > high):
            shown = raw if isinstance(raw, int | float) else repr(str(raw))
            raise OptionValueError(
                f"{option} must be a finite number{f' {rule}' if rule else ''}, got {shown}"
            )
        return value

    return parse


def float_option(
    option: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    help: str,
    **settings: Any,
) -> Any:
    """A `typer.Option` for a finite float in [low, high] (or (low, high] with `low_open`).

    --help shows a closed range as Typer does (`[0.0<=x<=10.0]`); an open one, which Typer cannot show, is
    written at the end of the help text instead, so the help and the check never disagree.
    """
    if low_open:
        help = f"{help} Must be {range_words(low, high, low_open=True)}."
    return typer.Option(
        option,
        parser=finite_float(option, low, high, low_open=low_open),
        min=None if low_open else low,
        max=None if low_open else high,
        help=help,
        **settings,
    )
