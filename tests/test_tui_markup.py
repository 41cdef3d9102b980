"""Outside text in the TUI is drawn as it is (eighty-sixth session's third TUI audit).

Each test is a case that failed before: a history item ending "[/s]" (a closing markup tag) ended the app as it
opened; an error quoting "[/i]" from a damaged file, a model path or a failed run did too, from an output
panel's border; the import dialog read its errors as markup (a crash, or a path "[@click=app.quit]" that became a
link quitting the app) and a pasted NUL ended the app; escape codes in a draft or an output reached the terminal;
rejecting a draft holding a lone surrogate ended the app; Textual's own ctrl+c hint showed its markup tags.
"""

from __future__ import annotations

from rich.text import Text
from textual import events
from tui_fakes import FakeService
from tui_helpers import DRAFT, SIZE, async_test, examples, make_app, one_user_service, wait_idle

from localpers.errors import LocalpersError
from localpers.tui.app import LocalpersApp
from localpers.tui.service import RewriteRequest, TextSink
from localpers.tui.text import drop_control_codes, plain, without_control_codes
from localpers.tui.widgets.token_strip import visible_piece
from localpers.users.history import HistoryItem
from localpers.users.store import UserStore


def notices(app: LocalpersApp) -> list[str]:
    return [notice.message for notice in app._notifications]


def fitted_user(*extra: HistoryItem) -> FakeService:
    store = UserStore()
    service = FakeService(store)
    user = store.create("ann")
    user.save_history([*examples("ann", 3), *extra])
    service.fit(user, lambda *_: None)
    store.use("ann")
    return service


@async_test
async def test_a_history_item_holding_markup_tags_is_shown_as_written() -> None:
    service = fitted_user(
        HistoryItem.create("headline", "A thread on the council", "Sarcasm, obviously [/s]"),
        HistoryItem.create("headline", "An article on sizes", "Size [b]matters"),
    )
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        table = app.main.history_panel.table
        shown = [str(table.get_row_at(row)[2]) for row in range(table.row_count)]
        assert "Size [b]matters" in shown and "Sarcasm, obviously [/s]" in shown
    assert app._exception is None


class FailingWithTags(FakeService):
    def rewrite(self, request: RewriteRequest, on_text: TextSink):  # type: ignore[override]
        raise LocalpersError("history.jsonl line 4: unknown task 'news[/i]'")


@async_test
async def test_an_error_quoting_markup_tags_is_shown_in_the_panel() -> None:
    store = UserStore()
    service = FailingWithTags(store)
    user = store.create("ann")
    user.save_history(examples("ann", 3))
    store.use("ann")
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        assert app.main.personal_panel.status == "failed: history.jsonl line 4: unknown task 'news[/i]'"
    assert app._exception is None


@async_test
async def test_the_import_dialog_shows_its_errors_as_written_and_refuses_a_nul() -> None:
    app = make_app(fitted_user())
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        for path, expected in (
            ("x[/y]", "x[/y]: no such file"),
            ("[@click=app.quit]q[/]", "[@click=app.quit]q[/]: no such file"),
            ("a\x00b", "the path holds a NUL character"),
        ):
            await pilot.press("ctrl+o")
            await pilot.pause()
            screen = app.screen
            screen.path_input.focus()
            app.post_message(events.Paste(path))  # as the terminal driver sends it: forwarded to the focus
            await pilot.pause()
            assert screen.path_input.value == path  # once, as pasted
            await pilot.press("enter")
            await pilot.pause(0.2)
            assert expected in str(screen.error.render()), str(screen.error.render())
            await pilot.press("escape")
            await pilot.pause()
        assert app.is_running
    assert app._exception is None


@async_test
async def test_rejecting_a_draft_holding_a_lone_surrogate_is_refused_in_one_notice() -> None:
    app = make_app(fitted_user())
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        app.main.draft.text = "Hello \ud800 world of bikes"
        await wait_idle(pilot)
        await pilot.press("ctrl+n")
        await pilot.pause(0.3)
        assert app.is_running
        assert any("lone surrogate" in message for message in notices(app)), notices(app)
    assert app._exception is None


@async_test
async def test_the_ctrl_c_hint_shows_no_markup_tags() -> None:
    app = make_app(fitted_user())
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        app.main.draft.blur()
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert "Press ctrl+q to quit the app" in notices(app), notices(app)


@async_test
async def test_a_pasted_escape_sequence_is_dropped_from_the_draft() -> None:
    # the draft drew a paste's escape codes as they were (an OSC retitled the terminal, SGR recoloured it) and the
    # model was shown them (eighty-seventh session); newlines and tabs stay
    from textual import events

    service = one_user_service()  # a user: the main screen, not the welcome, has the focus
    app = make_app(service)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        draft = app.main.draft
        draft.focus()
        await pilot.pause()
        assert app.screen is app.main and app.focused is draft
        # posted to the app, as the terminal driver does: the app forwards it to the focused widget (a Paste
        # posted to the draft itself bubbles up to the app and is forwarded again, so it lands twice)
        app.post_message(events.Paste("City \x1b]0;HACKED\x07council\n\tmeets \x1b[31mtoday\x00"))
        await wait_idle(pilot)
        assert draft.text == "City ]0;HACKEDcouncil\n\tmeets [31mtoday"
        drawn = "".join(segment.text for y in range(3) for segment in draft.render_line(y))
        assert "\x1b" not in drawn and "\x07" not in drawn
        assert service.rewrites and service.rewrites[-1].text == draft.text
        draft.clear()
        app.post_message(
            events.Paste("First paragraph.\rSecond one.\r\rThird.\r\nFourth.")
        )  # as VTE sends it
        await wait_idle(pilot)
        assert draft.text == "First paragraph.\nSecond one.\n\nThird.\nFourth."
    assert app._exception is None


def test_escape_codes_are_never_drawn_and_markup_is_never_read() -> None:
    draft = "Start \x1b]0;TITLE\x07 and \x1b[31mRED\x1b[0m end\x9b\tok\n"
    shown = without_control_codes(draft)
    assert "\x1b" not in shown and "\x07" not in shown and "\x9b" not in shown
    assert shown.startswith("Start \u241b]0;TITLE\u2407") and shown.endswith("\tok\n")
    assert drop_control_codes(draft) == "Start ]0;TITLE and [31mRED[0m end\tok\n"
    assert visible_piece("\x1b[2J") == "\u241b[2J"
    text = plain("Size [b]matters [/s]")
    assert isinstance(text, Text) and text.plain == "Size [b]matters [/s]" and not text.spans
