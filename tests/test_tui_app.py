"""Pilot tests of every TUI flow on a fake engine: typing, streaming, controls, users, Why, teaching, first run."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Select, TextArea
from tui_fakes import FAKE_SHA, FakeService, fake_text
from tui_helpers import DRAFT, SIZE, async_test, examples, make_app, wait_idle

from localpers.tui.app import LocalpersApp
from localpers.tui.screens.confirm import ConfirmScreen
from localpers.tui.screens.edit_accept import EditAcceptScreen
from localpers.tui.screens.import_history import ImportScreen
from localpers.tui.screens.welcome import WelcomeScreen
from localpers.tui.service import RewriteRequest
from localpers.tui.widgets.candidate_table import CandidateTable
from localpers.tui.widgets.history_panel import HistoryTable
from localpers.tui.widgets.stepper import Stepper
from localpers.tui.widgets.token_strip import TokenStrip
from localpers.users.folder import REJECTED_FILE
from localpers.users.history import demo_history_path, history_digest
from localpers.users.store import UserStore


@pytest.fixture
def service() -> FakeService:
    store = UserStore()
    store.create("ann").save_history(examples("ann", 4))
    store.create("bob").save_history(examples("bob", 6))
    store.use("ann")
    return FakeService(store)


def hold_fits(service: FakeService) -> threading.Event:
    """Make each of `service`'s fits wait (up to 10 s) until the returned event is set."""
    gate = threading.Event()
    original = service.fit

    def slow_fit(user, progress):  # type: ignore[no-untyped-def]
        gate.wait(timeout=10)
        return original(user, progress)

    service.fit = slow_fit  # type: ignore[method-assign]
    return gate


async def until_fitting(pilot: Any, app: LocalpersApp) -> None:
    """Wait (up to 5 s) until the app's fit has started."""
    for _ in range(100):
        await pilot.pause(0.05)
        if app.fit_running:
            break


def card(text: str, vector: int, strength: float = 1.0, top_k: int = 10) -> str:
    import numpy as np

    return fake_text(
        RewriteRequest(text, "headline", "card", 0, np.full(4, vector, np.float32), strength, top_k)
    )


@async_test
async def test_typing_generates_both_outputs_after_a_pause(service: FakeService) -> None:
    app = make_app(service)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        assert service.fits == ["ann"]  # ann had history but no fit: fitted on opening
        typed = "Bike lane opens"
        await pilot.press(*typed)
        await wait_idle(pilot)
        assert app.main.draft.text == typed
        assert app.main.baseline_panel.text == fake_text(RewriteRequest(typed, "headline", "global"))
        assert app.main.personal_panel.text == card(typed, vector=4)
        assert app.main.personal_panel.complete
        methods = [r.method for r in service.rewrites if r.text == typed]
        assert methods == ["card", "global"]  # debounced: one generation per output for the whole typing
        assert service.max_concurrent == 1


@async_test
async def test_ui_stays_responsive_and_streams_while_generating(service: FakeService) -> None:
    service.fit(service.store.get("ann"), lambda *_: None)  # fitted already: the generation starts at once
    service.fits.clear()
    service.hold = threading.Event()
    app = make_app(service, text="first draft words")
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(100):  # the generation is blocked before its first piece
            await pilot.pause(0.05)
            if app.main.personal_panel.status == "generating…":
                break
        assert app.main.personal_panel.status == "generating…"
        app.main.draft.focus()
        await pilot.press("end", *" and more")  # the UI still takes keys while the engine is busy
        assert app.main.draft.text == "first draft words and more"
        seen: set[str] = set()
        service.piece_delay = 0.05
        service.hold.set()
        for _ in range(200):
            await pilot.pause(0.02)
            seen.add(app.main.personal_panel.text)
            if not app.busy:
                break
        await wait_idle(pilot)
        final = card("first draft words and more", vector=4)
        assert app.main.personal_panel.text == final
        assert any(0 < len(text) < len(final) for text in seen)  # streamed piece by piece
        assert service.max_concurrent == 1  # the superseded generation never overlapped the new one


@async_test
async def test_strength_top_k_and_method_controls(service: FakeService) -> None:
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        global_runs = sum(r.method == "global" for r in service.rewrites)
        app.main.controls.strength.focus()
        await pilot.press("right")  # α 1.00 -> 1.50
        await wait_idle(pilot)
        assert app.main.personal_panel.text == card(DRAFT, 4, strength=1.5)
        await pilot.press("tab", "left")  # top-k 10 -> 5
        await wait_idle(pilot)
        assert app.main.personal_panel.text == card(DRAFT, 4, strength=1.5, top_k=5)
        assert sum(r.method == "global" for r in service.rewrites) == global_runs  # baseline from cache

        app.main.controls.method_select.focus()
        # card -> the global adapter with history (CARD uncorrected)
        await pilot.press("enter", "down", "enter")
        await wait_idle(pilot)
        assert app.main.controls.method == "global-history"
        assert app.main.personal_panel.text == f"History: {' '.join(DRAFT.split()[:5]).lower()}"
        assert app.main.controls.strength.disabled and app.main.controls.top_k.disabled
        # said in words, not by a dimmer grey alone (TUI audit, eighty-fourth session)
        assert [app.main.controls.strength.render().plain, app.main.controls.top_k.render().plain] == [
            "α off",
            "top-k off",
        ]

        app.main.controls.method_select.focus()
        await pilot.press("enter", "up", "enter")  # back to card: α and top-k kept, served from the cache
        await wait_idle(pilot)
        assert app.main.personal_panel.text == card(DRAFT, 4, strength=1.5, top_k=5)
        assert app.main.controls.top_k.render().plain == "top-k ‹5›"
        assert app.main.personal_panel.status.endswith("cached")

        count = len(service.rewrites)
        await pilot.press("ctrl+r")  # on demand: regenerates even though cached
        await wait_idle(pilot)
        assert len(service.rewrites) == count + 2


@async_test
async def test_task_switch_regenerates_both(service: FakeService) -> None:
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        app.main.controls.task_select.focus()
        await pilot.press("enter", "down", "enter")  # headline -> title
        await wait_idle(pilot)
        assert app.main.controls.task == "title"
        assert {r.method for r in service.rewrites if r.task == "title"} == {"card", "global"}


@async_test
async def test_switching_user(service: FakeService) -> None:
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        assert "user ann" in app.sub_title
        app.main.controls.user_select.focus()
        await pilot.press("enter", "down", "enter")  # ann -> bob
        await wait_idle(pilot)
        assert app.user is not None and app.user.name == "bob"
        assert service.store.active_name() == "bob"
        assert "user bob · 6 examples" in app.sub_title
        assert service.fits == ["ann", "bob"]
        assert app.main.personal_panel.text == card(DRAFT, vector=6)  # bob's vector
        assert app.main.history_panel.table.row_count == 6
        assert app.main.profile_panel.profile is not None and app.main.profile_panel.profile.user == "bob"


@async_test
async def test_a_fit_that_did_not_record_its_items_is_refitted_once_on_opening(service: FakeService) -> None:
    import numpy as np

    user = service.store.get("ann")
    old_report = {"mode": "vector", "n_items": 4}  # as an earlier localpers wrote it: no history digest
    user.save_fit(np.full(4, 9, np.float32), {"cluster": 0, "bundle_sha256": FAKE_SHA, "fit": old_report})
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        assert service.fits == ["ann"]  # once: the refit recorded which items it saw
        assert user.state()["fit"]["history_sha256"] == history_digest(user.history())
        assert app.profile is not None and not app.profile.needs_fit
        assert app.main.personal_panel.text == card(DRAFT, vector=4)  # the refitted vector, not the old one


@async_test
async def test_why_view_selects_tokens_and_shows_candidates(service: FakeService) -> None:
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        await pilot.press("f2")
        strip = app.main.why.query_one(TokenStrip)
        table = app.main.why.query_one(CandidateTable)
        assert app.focused is strip
        steps = strip.steps
        assert len(steps) == len(card(DRAFT, 4).split(" "))
        strongest = max(range(len(steps)), key=lambda i: abs(steps[i].correction))
        assert strip.selected == strongest
        await pilot.press("home", "right", "right")
        await pilot.pause()
        assert strip.selected == 2
        assert table.row_count == 2
        chosen_row = [str(cell) for cell in table.get_row_at(0)]
        assert chosen_row[0] == "▶" and steps[2].piece.strip() in chosen_row[1]
        assert "1 choice changed" in str(app.main.why.summary.render())
        examples = str(app.main.why.examples.render())  # the history the prompt showed, latest last
        assert app.main.why.examples.display and "Your history shown to the model (2)" in examples
        latest = app.user.history()[-1].output  # the active user's
        assert examples.rstrip().endswith(latest)


@async_test
async def test_accept_adds_to_history_refits_and_updates(service: FakeService) -> None:
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        accepted = app.main.personal_panel.text
        await pilot.press("ctrl+s")
        await wait_idle(pilot)
        user = service.store.get("ann")
        items = user.history()
        assert (items[-1].input, items[-1].output, items[-1].source) == (DRAFT, accepted, "tui")
        assert service.fits == ["ann", "ann"]
        assert app.profile is not None and app.profile.n_history == 5 and not app.profile.needs_fit
        assert user.state()["fit"]["n_items"] == 5
        assert app.main.personal_panel.text == card(DRAFT, vector=5)  # the refitted vector is in use
        assert "5 examples" in app.sub_title
        await pilot.press("ctrl+s")  # the new output is accepted too; the same text twice is not
        await wait_idle(pilot)
        await pilot.press("ctrl+s")
        await wait_idle(pilot)
        assert len(user.history()) == 7


@async_test
async def test_edit_and_accept(service: FakeService) -> None:
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        await pilot.press("ctrl+g")
        await pilot.pause()
        assert isinstance(app.screen, EditAcceptScreen)
        await pilot.press("ctrl+r")  # app actions are off while the dialog is open
        editor = app.screen.query_one(TextArea)
        editor.text = ""
        await pilot.press(*"Wheel Win")
        await pilot.press("ctrl+s")
        await wait_idle(pilot)
        assert app.screen is app.main
        assert service.store.get("ann").history()[-1].output == "Wheel Win"
        assert service.fits == ["ann", "ann"]


@async_test
async def test_edit_cancel_changes_nothing(service: FakeService) -> None:
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        before = service.store.get("ann").history()
        await pilot.press("ctrl+g")
        await pilot.pause()
        assert isinstance(app.screen, EditAcceptScreen)
        await pilot.press("escape")
        await wait_idle(pilot)
        assert not isinstance(app.screen, EditAcceptScreen)
        assert service.store.get("ann").history() == before
        assert service.fits == ["ann"]  # only the fit on opening: nothing to refit


@async_test
async def test_reject_keeps_a_negative_without_touching_history(service: FakeService) -> None:
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        rejected = app.main.personal_panel.text
        await pilot.press("ctrl+n")
        await pilot.press("ctrl+n")  # twice: kept once
        await wait_idle(pilot)
        user = service.store.get("ann")
        lines = (user.dir / REJECTED_FILE).read_text().splitlines()
        assert len(lines) == 1
        record = json.loads(lines[0])
        assert (record["input"], record["output"], record["method"], record["strength"]) == (
            DRAFT,
            rejected,
            "card",
            1.0,
        )
        assert len(user.history()) == 4
        assert app.profile is not None and app.profile.n_rejected == 1
        assert service.fits == ["ann"]


@async_test
async def test_accept_refuses_an_out_of_date_output(service: FakeService) -> None:
    service.hold = threading.Event()
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.3)
        await pilot.press("ctrl+s")  # nothing finished yet
        service.hold.set()
        await wait_idle(pilot)
        assert len(service.store.get("ann").history()) == 4


@async_test
async def test_remove_history_item_after_confirmation(service: FakeService) -> None:
    app = make_app(service)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        await pilot.press("f3")
        table = app.main.history_panel.query_one(HistoryTable)
        assert app.focused is table and table.row_count == 4
        newest = service.store.get("ann").history()[-1]
        await pilot.press("x")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        await pilot.pause()
        assert len(service.store.get("ann").history()) == 4
        await pilot.press("x")
        await pilot.pause()
        await pilot.press("y")
        await wait_idle(pilot)
        remaining = service.store.get("ann").history()
        assert len(remaining) == 3 and newest.id not in {item.id for item in remaining}
        assert table.row_count == 3
        assert service.fits == ["ann", "ann"]
        assert app.profile is not None and app.profile.fit is not None and app.profile.fit["n_items"] == 3
        await pilot.press("end")  # the last row, not a sideways scroll
        assert table.cursor_row == 2
        await pilot.press("home")
        assert table.cursor_row == 0


@async_test
async def test_refit_shows_progress_and_failure_is_reported_once(service: FakeService) -> None:
    service.fail_fit = "the history is damaged"
    app = make_app(service)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_idle(pilot)
        assert service.fits == ["ann"]  # failed once, not retried in a loop
        assert any("the history is damaged" in n.message for n in app._notifications)
        assert not app.main.progress.running
        # kept in view on the Profile tab once the notice is gone, not "up to date" or "not fitted" alone
        from localpers.tui.widgets.profile_panel import status_line

        shown = app.main.profile_panel.profile
        assert shown is not None and "the last fit failed: the history is damaged" in str(status_line(shown))
        service.fail_fit = None
        await pilot.press("ctrl+f")  # explicit refit
        await wait_idle(pilot)
        assert service.fits == ["ann", "ann"]
        assert app.profile is not None and app.profile.fit is not None
        assert app.profile.fit_error is None


@async_test
async def test_a_fit_refused_while_another_command_fits_the_user_is_tried_again(service: FakeService) -> None:
    """A `localpers fit` in a shell holds the user's fit lock: the TUI's refit was marked failed, and no automatic
    refit followed until ctrl+f, so its profile stayed behind the history (concurrent-use audit)."""
    service.busy_fits = 1
    app = make_app(service)
    app.busy_retry_delay = 0.05
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_idle(pilot)
        await pilot.pause(0.3)
        await wait_idle(pilot)
        assert service.fits == ["ann", "ann"]
        assert any(
            "being fitted or changed by another localpers command" in n.message for n in app._notifications
        )
        assert app.profile is not None and app.profile.fit is not None and app.profile.fit_error is None


@async_test
async def test_a_refit_that_keeps_an_imported_fit_says_it_was_kept(service: FakeService) -> None:
    """A user imported without its history keeps the fit it came with (nothing to fit): ctrl+f said "Profile
    updated" as if the user had been fitted anew (seventy-ninth session's final read); a real refit still does."""
    from localpers.users.folder import IMPORTED_WITHOUT_HISTORY

    store = UserStore()
    store.create("cy")
    store.use("cy")
    ann_fit = service.fit(store.get("ann"), lambda *_: None)
    service.kept_fit = ann_fit  # as `fit_user` keeps it: the imported state, mark and all, left as it is
    store.get("cy").save_state({"cluster": 0, "fit": ann_fit.to_json(), IMPORTED_WITHOUT_HISTORY: True})
    app = make_app(service)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_idle(pilot)
        await pilot.press("ctrl+f")
        await wait_idle(pilot)
        kept = [n for n in app._notifications if n.title == "Fit kept"]
        assert len(kept) == 1 and "cy was imported without its history" in kept[0].message
        assert "cluster 0, own vector from 4 pairs" in kept[0].message
        assert not any(n.title == "Profile updated" for n in app._notifications)
        store.get("cy").save_history(examples("cy", 3))
        await pilot.press("ctrl+f")
        await wait_idle(pilot)
        assert any(n.title == "Profile updated" for n in app._notifications)


@async_test
async def test_fit_kept_is_told_by_the_fit_itself_not_by_the_state_read_after_it(
    service: FakeService,
) -> None:
    """The TUI read the import's mark from the state after the fit lock was released, so a CLI fit landing in
    between (its new state has no mark) turned a kept fit into "Profile updated" (eightieth session's audit)."""
    store = UserStore()
    store.create("cy")
    store.use("cy")
    ann_fit = service.fit(store.get("ann"), lambda *_: None)
    service.kept_fit = ann_fit
    store.get("cy").save_state({"cluster": 0, "fit": ann_fit.to_json()})  # as a CLI fit just wrote it
    app = make_app(service)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_idle(pilot)
        await pilot.press("ctrl+f")
        await wait_idle(pilot)
        assert [n.title for n in app._notifications if n.title in ("Fit kept", "Profile updated")] == [
            "Fit kept"
        ]


@async_test
async def test_changes_another_command_makes_to_the_user_are_shown(service: FakeService) -> None:
    """The TUI read its user once: a history added to in a shell stayed listed as before and was not refitted, a
    user deleted and made anew refused every accept as 'no longer exists', and a deleted user stayed on screen
    with its fit applied (concurrent-use audit)."""
    app = make_app(service, text=DRAFT)
    app.user_watch_seconds = 0.05
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_idle(pilot)
        assert app.main.history_panel.table.row_count == 4 and service.fits == ["ann"]
        in_a_shell = UserStore().get("ann")
        in_a_shell.save_history([*in_a_shell.history(), *examples("added", 1)])  # `history add` elsewhere
        await pilot.pause(0.3)
        await wait_idle(pilot)
        assert app.main.history_panel.table.row_count == 5 and service.fits == ["ann", "ann"]
        UserStore().delete("ann")  # `user delete ann` and `user import --as ann` elsewhere
        UserStore().create("ann").save_history(examples("anew", 2))
        await pilot.pause(0.3)
        await wait_idle(pilot)
        assert app.user is not None and app.user.identity == UserStore().get("ann").identity
        assert app.main.history_panel.table.row_count == 2
        assert any("deleted and made anew by another" in n.message for n in app._notifications)
        await pilot.press("ctrl+s")  # an accept is written to the new user, not refused
        await wait_idle(pilot)
        assert len(UserStore().get("ann").history()) == 3
        UserStore().delete("ann")
        await pilot.pause(0.3)
        await wait_idle(pilot)
        assert app.is_running and app.user is None and app.main.history_panel.table.row_count == 0
        assert any("'ann' was deleted by another" in n.message for n in app._notifications)


@pytest.mark.parametrize("made_anew", [True, False])
@async_test
async def test_a_user_deleted_or_made_anew_during_the_apps_own_fit_is_noticed(
    service: FakeService, made_anew: bool
) -> None:
    """The watch waited for the app's own fit, whose end read the new folder as the one the views show: a deleted
    user stayed on screen, and one made anew refused every accept and carried the old user's failed fit."""
    gate = hold_fits(service)
    app = make_app(service, text=DRAFT)
    app.user_watch_seconds = 0.05
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await until_fitting(pilot, app)
        UserStore().delete("ann")  # in a shell, while the app's fit of ann runs
        if made_anew:
            UserStore().create("ann").save_history(examples("anew", 3))
        await pilot.pause(0.3)
        gate.set()
        await wait_idle(pilot)
        await pilot.pause(0.3)
        await wait_idle(pilot)
        if not made_anew:
            assert app.is_running and app.user is None
            return
        assert app.user is not None and app.user.identity == UserStore().get("ann").identity
        assert "ann" not in app._fit_failed and app.profile is not None and app.profile.fit is not None
        await pilot.press("ctrl+s")
        await wait_idle(pilot)
        assert len(UserStore().get("ann").history()) == 4


@async_test
async def test_progress_bar_is_shown_during_a_fit(service: FakeService) -> None:
    gate = hold_fits(service)
    app = make_app(service)
    async with app.run_test(size=SIZE) as pilot:
        await until_fitting(pilot, app)
        assert app.main.progress.running
        assert "fitting ann" in str(app.main.progress.label.render())
        gate.set()
        await wait_idle(pilot)
        assert not app.main.progress.running


@async_test
async def test_cold_start_user_falls_back_to_the_global_adapter() -> None:
    store = UserStore()
    store.create("new")
    service = FakeService(store)
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        assert service.fits == []
        assert "global adapter" in app.main.personal_panel.border_title
        assert app.main.personal_panel.text == app.main.baseline_panel.text
        assert "cold start" in app.sub_title
        assert [r.method for r in service.rewrites] == ["global"]  # one run feeds both panels


@async_test
async def test_before_a_fit_the_personal_panel_shows_the_users_history_without_the_correction() -> None:
    store = UserStore()
    store.create("new").save_history(examples("new", 3))
    service = FakeService(store)
    service.fail_fit = "the fit failed"  # the user stays unfitted
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        assert service.fits == ["new"]
        title = app.main.personal_panel.border_title
        assert "adapter with your history" in title and "not fitted" in title and len(title) < 56
        personal = [r for r in service.rewrites if r.method == "global-history"]
        assert personal and personal[-1].history is not None and len(personal[-1].history.pool) == 3
        assert app.main.personal_panel.text == fake_text(personal[-1]) != app.main.baseline_panel.text


@async_test
async def test_first_run_demo_user() -> None:
    service = FakeService(UserStore())
    app = make_app(service)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, WelcomeScreen)
        await pilot.press("d")
        await wait_idle(pilot)
        assert app.screen is app.main
        assert service.store.list() == ["demo"]
        assert app.user is not None and app.user.name == "demo"
        assert app.main.draft.text  # a demo article to start from
        assert app.main.personal_panel.text.startswith(" ".join(app.main.draft.text.split()[:5]).upper())
        shipped = len(demo_history_path().read_text().splitlines())
        assert app.profile is not None and app.profile.n_history == shipped and app.profile.can_personalize


@async_test
async def test_first_run_import(tmp_path: Path) -> None:
    good = tmp_path / "mine.jsonl"
    good.write_text("\n".join(json.dumps({"input": f"article {i}", "output": f"Mine {i}"}) for i in range(3)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input": "x"}\n')
    service = FakeService(UserStore())
    app = make_app(service)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("i")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ImportScreen)
        assert app.focused is screen.path_input
        screen.path_input.value = str(bad)
        await pilot.press("enter")
        await pilot.pause()
        assert "missing field 'output'" in str(screen.error.render())
        assert service.store.list() == []  # a bad file creates no user
        screen.path_input.value = str(good)
        await pilot.press("tab")
        assert app.focused is screen.user_input and screen.user_input.value == "me"
        screen.user_input.value = "mi"
        await pilot.press("end", *"ne", "enter")
        await wait_idle(pilot)
        assert app.screen is app.main
        assert service.store.list() == ["mine"] and service.store.active_name() == "mine"
        assert [item.output for item in service.store.get("mine").history()] == ["Mine 0", "Mine 1", "Mine 2"]
        assert service.fits == ["mine"]
        assert app.main.controls.user_select.value == "mine"


@async_test
async def test_first_run_quit() -> None:
    service = FakeService(UserStore())
    app = make_app(service)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0 and service.store.list() == []


@async_test
async def test_close_service_waits_for_the_engine(service: FakeService) -> None:
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
    app.engine_lock.acquire()  # a worker still decoding: the engine must not be closed under it
    closer = threading.Thread(target=app.close_service)
    closer.start()
    closer.join(timeout=0.3)
    assert closer.is_alive() and not service.closed
    app.engine_lock.release()
    closer.join(timeout=10)
    assert not closer.is_alive() and service.closed


@async_test
async def test_close_service_leaves_a_busy_engine_open_after_its_timeout(service: FakeService) -> None:
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
    app.engine_lock.acquire()
    try:
        app.close_service(timeout=0.1)
    finally:
        app.engine_lock.release()
    assert not service.closed


@async_test
async def test_keyboard_reaches_every_control(service: FakeService) -> None:
    app = make_app(service)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        chain = [widget.id for widget in app.screen.focus_chain]
        assert chain[:6] == ["task", "method", "user", "strength", "top-k", "draft"]
        assert app.focused is app.main.draft
        await pilot.press("shift+tab")
        assert app.focused is app.main.controls.top_k
        shown = {binding.key for binding in app.BINDINGS if binding.show}  # type: ignore[union-attr]
        assert {"ctrl+r", "ctrl+s", "ctrl+g", "ctrl+n", "ctrl+f", "ctrl+o"} <= shown
        titles = [str(tab.label) for tab in app.main.tabs.query("ContentTab")]
        assert titles == ["Why (F2)", "History (F3)", "Profile (F4)"]
        assert app.main.draft.border_title == "Draft (F1)"
        app.main.controls.strength.focus()
        await pilot.pause()
        assert isinstance(app.focused, Stepper)
        assert isinstance(app.main.controls.user_select, Select)


@async_test
async def test_a_model_that_fails_to_load_is_reported_in_place(service: FakeService) -> None:
    from localpers.errors import LocalpersError

    def broken_load() -> None:
        raise LocalpersError("backbone x.gguf is damaged; re-run `localpers doctor`")

    service.load = broken_load  # type: ignore[method-assign]
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        for panel in (app.main.baseline_panel, app.main.personal_panel):
            assert "x.gguf is damaged" in panel.status
        await pilot.press("end", "!")
        await wait_idle(pilot)
        assert "x.gguf is damaged" in app.main.personal_panel.status
        assert service.rewrites == [] and service.fits == []


@async_test
async def test_method_selector_offers_what_the_engine_supports(service: FakeService) -> None:
    from dataclasses import replace

    info = service.load()
    service.load = lambda: replace(info, methods=("cluster", "global"))  # type: ignore[method-assign]
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        from textual.widgets.select import InvalidSelectValueError

        select = app.main.controls.method_select
        with pytest.raises(InvalidSelectValueError):
            select.value = "card"
        assert app.main.controls.method == "cluster" and app.main.controls.strength.disabled
        assert app.main.personal_panel.text.startswith("Cluster 0:")


@async_test
async def test_a_crash_report_prints_no_local_variables(service: FakeService) -> None:
    """Textual's crash report listed every frame's locals: the draft and history outputs reached the terminal."""
    app = make_app(service)

    def crash() -> None:
        draft = (
            "ZQX" + "SECRET what the user was writing"
        )  # joined only at run time, so only a local shows it
        raise RuntimeError(f"broken while handling a draft of {len(draft)} characters")

    app.action_focus_draft = crash  # type: ignore[method-assign]
    reports: list = []
    fatal_error = app._fatal_error

    def keep_the_report() -> None:
        fatal_error()
        reports.extend(app._exit_renderables)  # printed and cleared when the app ends

    app._fatal_error = keep_the_report  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        async with app.run_test(size=SIZE) as pilot:
            await wait_idle(pilot)
            await pilot.press("f1")
            await pilot.pause()
    report = "".join(segment.text for renderable in reports for segment in renderable.segments)
    assert "RuntimeError" in report and "broken while handling" in report
    assert "ZQXSECRET" not in report


async def until_offered(pilot: Any, app: LocalpersApp, name: str, offered: bool = True) -> None:
    """Wait (a few watch ticks at most) until the User select offers `name`, or no longer does."""
    for _ in range(100):
        if (name in {value for _, value in app.main.controls.user_select._options}) == offered:
            return
        await pilot.pause(0.02)
    raise AssertionError(f"{name!r} {'never' if offered else 'still'} offered")


@async_test
async def test_users_made_or_deleted_by_another_command_are_offered_in_the_user_select(
    service: FakeService,
) -> None:
    """The User select listed the users once: a user made in a shell (or by `localpers demo`) never appeared, even
    after the user on screen was deleted there (concurrency audit, seventy-eighth session)."""
    app = make_app(service, text=DRAFT)
    app.user_watch_seconds = 0.05
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_idle(pilot)
        UserStore().create("dora").save_history(examples("dora", 2))  # `user create dora` in a shell
        await until_offered(pilot, app, "dora")
        users = app.main.controls.user_select
        assert users.value == "ann"  # still showing the app's user
        UserStore().delete("bob")  # another user than the one shown, deleted in a shell
        await until_offered(pilot, app, "bob", offered=False)
        assert users.value == "ann" and app.user is not None and app.user.name == "ann"
        users.value = "dora"
        await pilot.pause()
        await wait_idle(pilot)
        assert app.user is not None and app.user.name == "dora"
        UserStore().delete("dora")
        UserStore().create("erin")
        await until_offered(pilot, app, "erin")
        await wait_idle(pilot)
        assert app.user is None
        users.value = "erin"
        await pilot.pause()
        await wait_idle(pilot)
        assert app.user is not None and app.user.name == "erin"


@async_test
async def test_a_user_made_within_the_folders_timestamp_tick_is_offered(service: FakeService) -> None:
    """The watch compared the users folder's stat: a user made in the same timestamp tick as the last listing (on
    a file system with coarse timestamps) left it unchanged and was never offered (seventy-eighth session's
    review; mended in the seventy-ninth)."""
    app = make_app(service, text=DRAFT)
    app.user_watch_seconds = 0.05
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_idle(pilot)
        await pilot.pause(0.2)  # the watch has listed the users
        users_dir = UserStore().users_dir
        before = users_dir.stat()
        UserStore().create("dora")
        os.utime(users_dir, ns=(before.st_atime_ns, before.st_mtime_ns))  # a coarse tick: the same time
        await until_offered(pilot, app, "dora")


@async_test
async def test_a_watch_tick_while_the_app_closes_does_nothing(service: FakeService) -> None:
    """A tick of the user watch after the app began to close found no screen (`ScreenStackError`, a traceback
    at the end of a run under load; ninety-first session)."""
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_idle(pilot)
    UserStore().create("dora")  # a change the tick would otherwise go on to show
    app.watch_user_files()


@async_test
async def test_a_users_folder_that_cannot_be_listed_is_listed_again_later(
    service: FakeService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unreadable users folder ended the app, and a listing that failed was not tried again until the folder
    changed (seventy-eighth session's reviews)."""
    app = make_app(service, text=DRAFT)
    app.user_watch_seconds = 0.05
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_idle(pilot)

        def unreadable() -> list[str]:
            raise PermissionError(13, "Permission denied")

        with monkeypatch.context() as patched:
            patched.setattr(app.store, "list", unreadable)
            UserStore().create("dora")
            await pilot.pause(0.3)
            assert app.is_running and app.user is not None and app.user.name == "ann"
        # permissions mended: the folder itself does not change
        await until_offered(pilot, app, "dora")
