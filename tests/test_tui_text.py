"""The TUI's text fitting: columns get at most their width, with an ellipsis when cut."""

from localpers.tui.text import flatten_whitespace, shorten


def test_shorten_keeps_short_text_and_cuts_long_text_to_the_width() -> None:
    assert shorten("abc", 3) == "abc"
    assert shorten("abcdef", 4) == "abc…"
    assert len(shorten("x" * 100, 16)) == 16


def test_one_line_flattens_whitespace() -> None:
    assert flatten_whitespace("a\n b\t\tc ") == "a b c"
