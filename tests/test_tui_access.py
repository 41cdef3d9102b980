"""Keyboard-only and colour-independent use of the TUI (the seventy-third session's accessibility audit).

Before: the outputs could not take focus, so at 80x24 a long output's start could not be read by keyboard (a
stream pulled the view back to its end); focus on the dropdowns, the Why/Profile scrollers and the token strip was
a background shade that vanishes in 16 colours or NO_COLOR; notices lasted 5 s and told an error from a note by
colour alone, and took file names and the user's text as markup; ctrl+q quit with a draft written, without a word;
the removal question named only the item's id, and Enter (pressed by habit) answered yes.
"""

from __future__ import annotations

import pytest
from tui_fakes import FakeService
from tui_helpers import DRAFT, async_test, make_app, one_user_service, wait_idle

from localpers.tui.screens.confirm import ConfirmScreen
from localpers.tui.widgets.history_panel import HistoryTable
from localpers.tui.widgets.token_strip import TokenStrip

LONG = " ".join(f"word{n}" for n in range(400))


@pytest.fixture
def service() -> FakeService:
    return one_user_service()


@async_test
async def test_an_output_takes_focus_scrolls_by_keyboard_and_keeps_the_readers_place(
    service: FakeService,
) -> None:
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_idle(pilot)
        panel = app.main.baseline_panel
        panel.finish(LONG, "done")
        await pilot.pause()
        panel.focus()
        await pilot.pause()
        assert app.focused is panel and panel.max_scroll_y > 0
        assert panel.styles.border_top[0] == "double"  # the focus shows in the border's shape, not its colour
        await pilot.press("end")
        await pilot.pause()
        assert panel.scroll_y == panel.max_scroll_y
        await pilot.press("home")
        await pilot.pause()
        assert panel.scroll_y == 0
        panel.append(" more")  # a stream going on while the reader is at the start
        await pilot.pause()
        assert panel.scroll_y == 0
        await pilot.press("end")
        await pilot.pause()
        panel.append(" and more")  # at the end: it follows
        await pilot.pause()
        assert panel.scroll_y == panel.max_scroll_y


@async_test
async def test_focus_is_shown_by_shape_or_reverse_video_not_colour_alone(service: FakeService) -> None:
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_idle(pilot)
        task = app.main.controls.task_select
        task.focus()
        await pilot.pause()
        current = task.query_one("SelectCurrent")
        assert "reverse" in str(current.styles.text_style)
        await pilot.press("f2")
        await pilot.pause()
        strip = app.main.why.query_one(TokenStrip)
        strip.focus()
        await pilot.pause()
        assert strip.styles.border_left[0] == "outer"
        scroller = app.main.query_one("#why-scroll")
        scroller.focus()
        await pilot.pause()
        assert scroller.styles.border_left[0] == "outer"


@async_test
async def test_notices_stay_long_enough_and_say_error_in_words(service: FakeService) -> None:
    app = make_app(service)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_idle(pilot)
        app.notify("cannot read /tmp/[b]odd[/b].jsonl", severity="error")
        app.notify("saved", timeout=3)
        await pilot.pause()
        error, note = list(app._notifications)[-2:]
        assert error.title == "Error" and error.timeout >= 10 and not error.markup
        assert note.title == "" and note.timeout >= 10


@async_test
async def test_quitting_with_a_draft_asks_first(service: FakeService) -> None:
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_idle(pilot)
        await pilot.press("ctrl+q")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen) and app.is_running
        await pilot.press("enter")  # by habit: answers nothing
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        await pilot.pause()
        assert app.screen is app.main and app.is_running
        await pilot.press("ctrl+q", "ctrl+q")  # twice: quits
        await pilot.pause()
        assert not app.is_running


@async_test
async def test_the_removal_question_quotes_the_item(service: FakeService) -> None:
    app = make_app(service)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_idle(pilot)
        await pilot.press("f3")
        table = app.main.history_panel.query_one(HistoryTable)
        assert app.focused is table
        newest = service.store.get("ann").history()[-1]
        await pilot.press("x")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        assert newest.output[:40] in app.screen.question
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen) and len(service.store.get("ann").history()) == 4


@async_test
async def test_escape_after_an_edit_asks_before_the_edit_is_lost(service: FakeService) -> None:
    from localpers.tui.screens.edit_accept import EditAcceptScreen

    app = make_app(service, text=DRAFT)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_idle(pilot)
        await pilot.press("ctrl+g")
        await pilot.pause()
        assert isinstance(app.screen, EditAcceptScreen)
        await pilot.press(*" by me")
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")  # keep editing
        await pilot.pause()
        editor = app.screen
        assert isinstance(editor, EditAcceptScreen) and editor.editor.text.endswith(" by me")
        await pilot.press("escape", "y")
        await pilot.pause()
        assert app.screen is app.main and len(service.store.get("ann").history()) == 4


@async_test
async def test_picking_no_user_puts_the_open_user_back(service: FakeService) -> None:
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_idle(pilot)
        users = app.main.controls.user_select
        users.clear()  # what choosing the "(no user)" line does
        await pilot.pause()
        await pilot.pause()
        assert users.value == "ann" and app.user is not None and app.user.name == "ann"


@async_test
async def test_ctrl_q_on_another_question_still_asks_about_the_draft(service: FakeService) -> None:
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_idle(pilot)
        await pilot.press("f3", "x")  # the removal question
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen) and "Remove" in app.screen.question
        await pilot.press("ctrl+q")
        await pilot.pause()
        assert app.is_running and isinstance(app.screen, ConfirmScreen) and "Quit" in app.screen.question
        await pilot.press("y")
        await pilot.pause()
        assert not app.is_running


@async_test
async def test_quitting_from_an_edit_says_the_edit_is_lost(service: FakeService) -> None:
    """ctrl+q in the Edit dialog asked only about the draft ("your history and accepted outputs are" kept) and `y`
    threw the edited output away unsaid (eighty-eighth session's TUI audit)."""
    from localpers.tui.screens.edit_accept import EditAcceptScreen

    app = make_app(service, text=DRAFT)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_idle(pilot)
        await pilot.press("ctrl+g")
        await pilot.pause()
        assert isinstance(app.screen, EditAcceptScreen)
        await pilot.press(*" by me")
        app.main.draft.text = ""  # with no draft it did not even ask: the edit was lost at once
        await pilot.press("ctrl+q")
        await pilot.pause()
        assert app.is_running and isinstance(app.screen, ConfirmScreen)
        assert "edit of the output is not accepted or kept" in app.screen.question
        await pilot.press("n")
        await pilot.pause()
        editor = app.screen
        assert isinstance(editor, EditAcceptScreen) and editor.editor.text.endswith(" by me")
        await pilot.press("ctrl+q", "ctrl+q")  # twice: quits
        await pilot.pause()
        assert not app.is_running
