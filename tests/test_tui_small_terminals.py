"""The app on small terminals and long texts (fake engine): what a user must still see and reach.

Each case was cut off before: the history table's cursor below the visible rows at 80x24, the profile's last rows
and the Why view's candidate table out of reach, a long history output pushing the tokens out of the Why tab,
dialogs wider than the terminal, and the footer dropping Import at 80 columns.
"""

from __future__ import annotations

import dataclasses

from rich.style import Style
from rich.text import Text
from textual.app import App
from tui_fakes import FakeService
from tui_helpers import DRAFT, async_test, examples, make_app, visible_lines, wait_idle

from localpers.methods.reports import CandidateShift, RewriteStep
from localpers.tui.app import LocalpersApp
from localpers.tui.widgets.history_panel import HistoryTable
from localpers.tui.widgets.token_strip import TokenStrip
from localpers.users.history import HistoryItem
from localpers.users.store import UserStore

SMALL = (80, 24)


def service_with(items: list[HistoryItem]) -> FakeService:
    store = UserStore()
    store.create("ann").save_history(items)
    store.use("ann")
    return FakeService(store)


def screen_text(app: App[None]) -> str:
    return "\n".join(visible_lines(app.export_screenshot()))


@async_test
async def test_the_history_cursor_stays_in_view_at_80x24() -> None:
    app = make_app(service_with(examples("ann", 30)), text=DRAFT)
    async with app.run_test(size=SMALL) as pilot:
        await wait_idle(pilot)
        await pilot.press("f3")
        for _ in range(25):
            await pilot.press("down")
        await pilot.pause(0.2)
        table = app.main.history_panel.query_one(HistoryTable)
        selected = table.coordinate_to_cell_key(table.cursor_coordinate)[0].value
        assert table.cursor_row == 25 and selected is not None and selected in screen_text(app)


@async_test
async def test_the_profile_and_the_candidates_can_be_scrolled_to_at_80x24() -> None:
    app = make_app(service_with(examples("ann", 4)), text=DRAFT)
    async with app.run_test(size=SMALL) as pilot:
        await wait_idle(pilot)
        await pilot.press("f4")
        assert app.focused is app.main.query_one("#profile-scroll")  # arrows scroll the profile
        await pilot.press("end")
        await pilot.pause(0.2)
        assert "fitted at" in screen_text(app)
        await pilot.press("f2")
        assert isinstance(app.focused, TokenStrip)  # the tab's control first, not its scroll container
        await pilot.press("tab")
        await pilot.pause(0.2)
        assert "rank before" in screen_text(app)  # the focused candidate table is scrolled into view


@async_test
async def test_long_history_outputs_leave_the_tokens_in_the_why_tab() -> None:
    long_items = [
        HistoryItem.create("headline", f"article {i} about the town", f"Long {i} " + "word " * 400)
        for i in range(4)
    ]
    app = make_app(service_with(long_items), text=DRAFT)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_idle(pilot)
        await pilot.press("f2")
        await pilot.pause(0.2)
        shown = screen_text(app)
        assert "pushed up" in shown and "rank before" in shown
        assert "Long 3 word word" in shown and "…" in shown  # each example cut to one line


@async_test
async def test_the_welcome_dialog_fits_a_40_column_terminal() -> None:
    app = LocalpersApp(FakeService(UserStore()), debounce=0.05)
    async with app.run_test(size=(40, 15)) as pilot:
        await wait_idle(pilot)
        dialog = app.screen.query_one("WelcomeScreen > Vertical")
        assert dialog.region.width <= 40 and dialog.region.height <= 15
        shown = screen_text(app)  # the text from its start, and every button (stacked, one line each)
        assert "Welcome to localpers" in shown and "Quit (q)" in shown and "Import my history" in shown
        await pilot.press("shift+tab", "end")  # the text is reachable and scrolls to its last line
        await pilot.pause(0.2)
        shown = screen_text(app)
        assert "your headline" in shown and "Welcome to localpers" not in shown and "Quit (q)" in shown
        await pilot.press("home")
        await pilot.pause(0.2)
        assert "Welcome to localpers" in screen_text(app)
        await pilot.press("q")
        await pilot.pause(0.2)
    assert app.return_code == 0


@async_test
async def test_the_footer_shows_accept_and_import_at_80_columns() -> None:
    app = make_app(service_with(examples("ann", 4)), text=DRAFT)
    async with app.run_test(size=SMALL) as pilot:
        await wait_idle(pilot)
        footer = screen_text(app).splitlines()[-1]
        assert "Accept" in footer and "Import" in footer and "Quit" in footer


@async_test
async def test_the_footer_keeps_import_at_80_columns_whatever_has_focus() -> None:
    from localpers.tui.widgets.stepper import Stepper

    app = make_app(service_with(examples("ann", 4)), text=DRAFT)
    async with app.run_test(size=SMALL) as pilot:
        await wait_idle(pilot)
        await pilot.press("f2")  # the token strip: its arrows are one footer entry
        await pilot.pause(0.2)
        footers = {"token strip": screen_text(app).splitlines()[-1]}
        app.screen.query(Stepper).first().focus()
        await pilot.pause(0.2)
        footers["stepper"] = screen_text(app).splitlines()[-1]
        await pilot.press("f3")
        await pilot.pause(0.2)
        footers["history table"] = screen_text(app).splitlines()[-1]
    for focused, footer in footers.items():
        assert "Import" in footer and "Refit" in footer and "Quit" in footer, (focused, footer)
    assert "Token" in footers["token strip"] and "Adjust" in footers["stepper"]
    assert "Remove" in footers["history table"]


@async_test
async def test_an_open_dialog_shows_its_own_keys_in_the_footer() -> None:
    app = make_app(service_with(examples("ann", 4)), text=DRAFT)
    async with app.run_test(size=SMALL) as pilot:
        await wait_idle(pilot)
        await pilot.press("f3", "x")  # remove the selected history item: a yes/no question
        await pilot.pause()
        footer = screen_text(app).splitlines()[-1]
        assert "Yes" in footer and "No" in footer and "Accept" not in footer, footer
        await pilot.press("n", "ctrl+g")  # edit and accept
        await wait_idle(pilot)
        footer = screen_text(app).splitlines()[-1]
        assert "Accept" in footer and "Cancel" in footer and "Import" not in footer, footer


@async_test
async def test_a_long_output_scrolls_and_a_stream_is_followed_to_its_end() -> None:
    from textual.app import ComposeResult

    from localpers.tui.widgets.output_panel import OutputPanel

    class OnePanel(App[None]):
        def compose(self) -> ComposeResult:
            yield OutputPanel("Personalized")

    app = OnePanel()
    async with app.run_test(size=(40, 10)) as pilot:
        panel = app.query_one(OutputPanel)
        panel.begin("generating…")
        for line in range(30):
            panel.append(f"line {line}\n")
        await pilot.pause(0.2)
        assert panel.max_scroll_y > 0 and panel.scroll_y == panel.max_scroll_y  # followed the stream
        assert "line 29" in screen_text(app) and "line 0" not in screen_text(app)
        panel.scroll_home(animate=False)
        await pilot.pause(0.1)
        assert "line 0" in screen_text(app)


def test_the_token_strip_marks_the_push_without_colour() -> None:
    def step(token: int, correction: float) -> RewriteStep:
        return RewriteStep(token, f"t{token} ", correction, [CandidateShift(token, f"t{token}", 1.0, 1.0)])

    strip = TokenStrip()
    strip.steps = [step(1, 2.0), step(2, -2.0), step(3, 0.1)]
    strip.selected = 2
    rendered: Text = strip.render()
    style_of = {rendered.plain[span.start : span.end]: str(span.style) for span in rendered.spans}
    assert "bold" in style_of["t1 "] and "italic" not in style_of["t1 "]  # pushed up
    assert "italic" in style_of["t2 "] and "bold" not in style_of["t2 "]  # pushed down
    assert "italic" not in style_of["t3 "] and "bold" not in style_of["t3 "]  # a small push, selected
    assert "reverse" in style_of["t3 "]


def test_a_long_series_is_one_profile_line() -> None:
    from rich.console import Console

    from localpers.tui.userdata import Profile
    from localpers.tui.widgets.profile_panel import profile_table

    console = Console(width=80, record=True)
    console.print(
        profile_table(Profile(user="ann", n_history=5, series=((3, "Weekly Picks\n" + "word " * 300),)))
    )
    lines = console.export_text().splitlines()
    series = [line for line in lines if line.startswith("series")]
    assert len(lines) == 4 and len(series) == 1 and series[0].rstrip().endswith("…")


@async_test
async def test_the_light_theme_keeps_status_texts_readable() -> None:
    """The personalized panel's title (1.76:1) and the profile's refit-due line (2.11:1) were hard to read."""
    from textual.color import Color

    from localpers.tui.text import contrast_ratio as contrast
    from localpers.tui.widgets.output_panel import OutputPanel
    from localpers.tui.widgets.profile_panel import ProfilePanel

    app = make_app(service_with(examples("ann", 4)), text=DRAFT)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_idle(pilot)
        app.theme = "textual-light"
        await pilot.pause(0.2)
        background = Color.parse(app.theme_variables["background"])
        personal = app.query_one("OutputPanel.personal", OutputPanel)
        styles = personal.styles
        for automatic, colour in (
            (styles.auto_border_title_color, styles.border_title_color),
            (styles.auto_border_subtitle_color, styles.border_subtitle_color),
        ):
            assert automatic or contrast(colour, background) >= 4.5  # "auto": Textual picks a contrasting one
        panel = app.query_one(ProfilePanel)
        assert panel.profile is not None
        panel.profile = dataclasses.replace(panel.profile, bundle_matches=False)  # "refit due": a warning
        await pilot.pause(0.1)
        table = panel.content
        status = next(cell for cell in table.columns[1].cells if "refit due" in str(cell))  # type: ignore[attr-defined]
        colour = Style.parse(str(status.style)).color
        assert colour is not None and contrast(Color.parse(colour.get_truecolor().hex), background) >= 4.5


@async_test
async def test_a_wide_terminal_shows_long_user_names_whole() -> None:
    """At 13 columns two names that share their start ("writer-alice-…-work", "…-home") looked the same."""
    store = UserStore()
    for name in ("writer-alice-long-name-2024-work", "writer-alice-long-name-2024-home"):
        store.create(name).save_history(examples(name, 4))
    store.use("writer-alice-long-name-2024-work")
    app = make_app(FakeService(store), text=DRAFT)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_idle(pilot)
        bar = visible_lines(app.export_screenshot())[2]
        assert "writer-alice-long-name-2024-work" in bar and "top-k" in bar, bar
