"""Whom the TUI's background refits fit (TUI audit, eighty-fourth session): the user whose history changed, even
when another is shown by the time the fit starts, and a failed fit of a deleted user is not held against a new
user of that name."""

from __future__ import annotations

import threading

from test_tui_damage import fitted_service
from tui_helpers import DRAFT, SIZE, async_test, examples, make_app, wait_idle

from localpers.tui.app import LocalpersApp
from localpers.tui.widgets.profile_panel import status_line


def held_fits(service) -> threading.Event:  # type: ignore[no-untyped-def]
    """Make the service's fits wait for the returned event (set it to let them run)."""
    gate, fit = threading.Event(), service.fit
    service.fit = lambda user, progress: (gate.wait(10), fit(user, progress))[1]
    return gate


async def until_fitting(pilot, app: LocalpersApp) -> None:  # type: ignore[no-untyped-def]
    for _ in range(100):
        await pilot.pause(0.05)
        if app.fit_running:
            return
    raise AssertionError("no fit started")


@async_test
async def test_an_accepted_outputs_refit_fits_its_user_after_a_switch_within_the_delay() -> None:
    """ann accepted an output and the User select went to bob before the refit's delay ran out: bob was fitted
    (for nothing) and ann's fit stayed a history behind."""
    service = fitted_service()
    app = LocalpersApp(service, debounce=0.05, refit_delay=1.0, text=DRAFT)  # the app's own delay
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        await pilot.press("ctrl+s")
        await pilot.pause(0.1)
        app.main.controls.user_select.value = "bob"
        await wait_idle(pilot)
        ann = service.store.get("ann")
        assert service.fits == ["ann"]
        assert ann.state()["fit"]["n_items"] == len(ann.history()) == 5


@async_test
async def test_a_refit_queued_behind_a_running_fit_fits_its_user_after_a_switch() -> None:
    service = fitted_service()
    gate = held_fits(service)
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        await pilot.press("ctrl+f")  # ann's fit runs, held
        await until_fitting(pilot, app)
        await pilot.press("ctrl+s")  # her accepted output's refit waits for it
        await pilot.pause(0.3)
        app.main.controls.user_select.value = "bob"
        await pilot.pause(0.2)
        gate.set()
        await wait_idle(pilot)
        ann = service.store.get("ann")
        assert service.fits == ["ann", "ann"]
        assert ann.state()["fit"]["n_items"] == len(ann.history()) == 5


@async_test
async def test_a_new_user_under_a_deleted_users_name_is_not_held_to_its_failed_fit() -> None:
    """ann was deleted by another command while her fit ran; the failure was kept under her name, so a new ann
    was said to have a failed fit and was never fitted automatically."""
    service = fitted_service()
    service.store.get("ann").save_history(examples("ann", 5))  # a fit is due on opening
    gate = held_fits(service)
    app = make_app(service, text=DRAFT)
    app.user_watch_seconds = 0.2
    async with app.run_test(size=SIZE) as pilot:
        await until_fitting(pilot, app)
        service.store.delete("ann")  # `localpers user delete ann` in a shell
        await pilot.pause(0.6)
        assert app.user is None
        gate.set()
        await wait_idle(pilot)
        service.store.create("ann").save_history(examples("ann", 3))
        await pilot.pause(0.6)
        app.main.controls.user_select.value = "ann"
        await wait_idle(pilot)
        assert service.fits == ["ann", "ann"]  # the new ann is fitted on opening
        assert app.profile is not None and status_line(app.profile).plain == "up to date"
