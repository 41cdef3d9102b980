"""The TUI under the ninety-first session's audit: each test is a case that lost or showed the wrong thing before.

A stop signal while the Edit dialog held a changed output kept the draft only; a second stop (a start with
`--text` leaves a kept draft waiting) replaced the draft the first had kept; a kept draft over the size a start
reads was "kept" and then refused; Escape on the welcome screen quit without asking, losing a draft reopened
from the last stop; the Edit dialog drew an output's escape codes raw; a damaged rejected-outputs file was told
again at every refresh; a native error's many lines filled a notice; a refresh read and parsed the history twice,
and an accept and a History tab remove read it again after writing it. (The import that said "fitting…" without a
fit is tested in `test_tui_edges.py`, beside the import it extends.)
"""

from __future__ import annotations

import signal

from read_counting import count_history_reads
from tui_fakes import FakeService
from tui_helpers import DRAFT, SIZE, async_test, examples, make_app, one_user_service, wait_idle

from localpers.tui.engine_jobs import describe
from localpers.tui.kept_draft import DRAFT_LIMIT, keep_draft, kept_draft_path, take_kept_draft
from localpers.tui.screens.confirm import ConfirmScreen
from localpers.tui.screens.edit_accept import EditAcceptScreen
from localpers.tui.screens.welcome import WelcomeScreen
from localpers.users.folder import REJECTED_FILE
from localpers.users.store import UserStore


@async_test
async def test_a_stop_signal_keeps_an_edit_under_way_after_the_draft() -> None:
    app = make_app(one_user_service(), text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        await pilot.press("ctrl+g")
        await pilot.pause()
        assert isinstance(app.screen, EditAcceptScreen)
        app.screen.editor.text = "My Own Headline"
        app._stop_by_signal(signal.SIGTERM)
        await pilot.pause()
    assert app.draft_kept
    assert take_kept_draft() == (f"{DRAFT}\n\nMy Own Headline", None)


def test_a_second_stop_adds_its_draft_to_one_not_yet_reopened_and_a_draft_too_big_is_not_kept() -> None:
    assert keep_draft("the first draft") is None
    assert keep_draft("the first draft") is None  # the same text is not doubled
    assert keep_draft("the second draft") is None
    assert take_kept_draft() == ("the first draft\n\nthe second draft", None)
    problem = keep_draft("x" * (DRAFT_LIMIT + 1))
    assert problem is not None and "more than the" in problem and not kept_draft_path().exists()
    kept_draft_path().write_bytes(b"\xff not text")  # one that cannot be read is never replaced
    problem = keep_draft("words")
    assert problem is not None and "\n" not in problem and kept_draft_path().read_bytes() == b"\xff not text"


@async_test
async def test_a_start_with_its_own_text_says_a_kept_draft_waits() -> None:
    assert keep_draft("kept at the last stop") is None
    app = make_app(one_user_service(), text=DRAFT)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_idle(pilot)
        told = [notice.message for notice in app._notifications]
        assert any(str(kept_draft_path()) in message and "waits" in message for message in told), told
        assert app.main.draft.text == DRAFT
    assert kept_draft_path().read_text() == "kept at the last stop"


@async_test
async def test_leaving_the_welcome_screen_asks_before_a_reopened_draft_is_lost() -> None:
    assert keep_draft("a draft from the last stop") is None
    app = make_app(FakeService(UserStore()))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, WelcomeScreen) and app.main.draft.text == "a draft from the last stop"
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen) and app.is_running
        await pilot.press("n")
        await pilot.pause()
        assert isinstance(app.screen, WelcomeScreen) and app.main.draft.text == "a draft from the last stop"


@async_test
async def test_the_edit_dialog_draws_no_control_codes_of_the_output() -> None:
    app = make_app(one_user_service(), text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        app.push_screen(EditAcceptScreen("Bike \x1b]0;owned\x07Lane \x1b[31mOpens", lambda text: None))
        await pilot.pause()
        assert app.screen.editor.text == "Bike ]0;ownedLane [31mOpens"


@async_test
async def test_a_damaged_rejected_file_is_told_once_not_at_every_refresh() -> None:
    service = one_user_service()
    (service.store.get("ann").dir / REJECTED_FILE).write_text("{not json\n")
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_idle(pilot)
        for _ in range(3):
            app.refresh_user_views()
            await pilot.pause()
        told = [notice.message for notice in app._notifications if REJECTED_FILE in notice.message]
        assert len(told) == 1, told


def test_an_engine_error_of_many_lines_is_described_in_one() -> None:
    described = describe(RuntimeError("CUDA out of memory.\nTried to allocate 2 GiB\n  at frame 3"))
    assert described == "RuntimeError: CUDA out of memory. Tried to allocate 2 GiB at frame 3"


@async_test
async def test_a_refresh_keeps_the_selected_history_row() -> None:
    """A refresh the user did not ask for (a refit's end, another command's change) put the History cursor on the
    newest item, which `x` then offered to remove."""
    service = one_user_service()
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        table = app.main.history_panel.table
        table.move_cursor(row=2, animate=False)
        chosen = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        app.refresh_user_views()
        await pilot.pause()
        assert table.cursor_row == 2
        assert table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value == chosen
        user = service.store.get("ann")
        user.save_history([item for item in user.history() if item.id != chosen])  # removed elsewhere
        app.refresh_user_views()
        await pilot.pause()
        assert table.row_count == 3 and table.cursor_row == 2  # the row now in its place


@async_test
async def test_the_personal_panels_title_follows_the_user_while_the_draft_is_empty() -> None:
    """With an empty draft `regenerate` returned before the title was made: a switch to a user with no history
    kept the last user's "CARD · cluster 0 · α ..." title."""
    service = one_user_service()
    service.store.create("cy")
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        assert "cluster" in app.main.personal_panel.border_title
        app.main.draft.text = ""
        await wait_idle(pilot)
        app.select_user("cy")
        await wait_idle(pilot)
        assert app.main.personal_panel.border_title == "Personalized · no history yet: global adapter"


@async_test
async def test_a_user_made_elsewhere_waits_until_the_user_list_is_closed() -> None:
    """New options while the User list was open moved its highlight back to the session's user: Enter on the
    name the user had moved to picked the session's own user again."""
    service = one_user_service()
    service.store.create("bob").save_history(examples("bob", 2))
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        select = app.main.controls.user_select
        select.focus()
        await pilot.press("enter")
        await pilot.pause()
        await pilot.press("down")  # bob
        await pilot.pause()
        service.store.create("aaa")
        app.watch_user_files()
        await pilot.pause()
        await pilot.press("enter")
        await wait_idle(pilot)
        assert app.user is not None and app.user.name == "bob"
        app.watch_user_files()  # the list closed: the new user is offered now
        await pilot.pause()
        assert app._listed_names == ["aaa", "ann", "bob"]


@async_test
async def test_a_refresh_reads_the_history_once(monkeypatch) -> None:
    """`refresh_user_views` read and parsed the history, then `load_profile` did again: with a long history each
    accept held the UI for a second or more on a small machine."""
    service = one_user_service()
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        reads = count_history_reads(monkeypatch)
        app.refresh_user_views()
        assert reads == ["ann"]


@async_test
async def test_an_accept_reads_the_history_once(monkeypatch) -> None:
    """The accept read the history under the user's lock to add the item, then the refresh read and parsed it
    again from the file just written (about 2 s of the UI thread with a 499-item history on a loaded machine)."""
    service = one_user_service()
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        reads = count_history_reads(monkeypatch)
        assert app.accept_text("headline", "An article about the harbour", "Harbour Reopens") is None
        assert reads == ["ann"]
        assert app.profile is not None and app.profile.n_history == len(app.user.history())
        assert app.main.history_panel.items == app.user.history()


@async_test
async def test_a_remove_in_the_history_tab_reads_the_history_once(monkeypatch) -> None:
    """The History tab's remove read and parsed the history under the user's lock to take the item out, then the
    refresh read and parsed it again from the file just written, as the accept did."""
    service = one_user_service()
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        await pilot.press("f3")
        app.refit_delay = 3600.0  # the refit the remove schedules reads the history too: not within this test
        await pilot.press("x")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        reads = count_history_reads(monkeypatch)
        await pilot.press("y")
        await pilot.pause()
        assert reads == ["ann"]
        assert app.profile is not None and app.profile.n_history == len(app.user.history()) == 3
        assert app.main.history_panel.items == app.user.history()
