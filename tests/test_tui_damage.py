"""Pilot and unit tests of the TUI when a user's files are damaged, a run or an accept is refused, or what
decides an output changes (the TUI audit's findings): the app reports in one line and keeps running."""

from __future__ import annotations

import json

import pytest
from fifo_helpers import fed_fifo
from textual.widgets import Static, TextArea
from tui_fakes import FAKE_SHA, FakeService
from tui_helpers import DRAFT, SIZE, async_test, examples, make_app, wait_idle

from localpers.errors import LocalpersError
from localpers.methods.reports import RewriteResult
from localpers.tui.app import LocalpersApp
from localpers.tui.runs import personal_request, request_key
from localpers.tui.screens.edit_accept import EditAcceptScreen
from localpers.tui.screens.welcome import WelcomeScreen
from localpers.tui.service import RewriteRequest, TextSink
from localpers.tui.userdata import import_history_file, load_profile
from localpers.users.folder import REJECTED_FILE
from localpers.users.store import User, UserStore


def fitted_service(service_type: type[FakeService] = FakeService) -> FakeService:
    """ann (4 items) and bob (6 items), both fitted, ann active."""
    store = UserStore()
    service = service_type(store)
    for name, count in (("ann", 4), ("bob", 6)):
        user = store.create(name)
        user.save_history(examples(name, count))
        service.fit(user, lambda *_: None)
    store.use("ann")
    service.fits.clear()
    return service


def notices(app: LocalpersApp) -> list[str]:
    return [notice.message for notice in app._notifications]


def set_state(user: User, **fields: object) -> None:
    state = json.loads(user.state_path.read_text())
    user.state_path.write_text(json.dumps({**state, **fields}))


# ---------------------------------------------------------------- 1. a damaged history.jsonl
@async_test
async def test_a_damaged_history_is_reported_and_the_app_keeps_running() -> None:
    service = fitted_service()
    service.store.get("bob").history_path.write_text("garbage\n")
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        app.main.controls.user_select.value = "bob"  # switching to the damaged user regenerates
        await wait_idle(pilot)
        assert app.is_running and app.user is not None and app.user.name == "bob"
        assert "history.jsonl line 1: not valid JSON" in app.main.personal_panel.status
        assert app.main.baseline_panel.text.startswith("Plain:")  # the baseline still generates
        assert any("history.jsonl line 1" in notice for notice in notices(app))
        app.main.draft.focus()
        await pilot.press(*" more")  # typing regenerates too
        await wait_idle(pilot)
        assert app.is_running and "history.jsonl line 1" in app.main.personal_panel.status


@async_test
async def test_a_history_holding_one_line_twice_is_listed_and_removable() -> None:
    """A line repeated in history.jsonl (edited by hand, or stored before control characters were removed on
    import, which gives two lines one id) ended the app: its table's row keys are item ids, which must be unique.
    The history reads each item once."""
    service = fitted_service()
    bob = service.store.get("bob")
    lines = bob.history_path.read_text().splitlines(keepends=True)
    bob.history_path.write_text("".join([*lines, lines[0]]))  # the oldest item again, as the newest line
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        app.main.controls.user_select.value = "bob"
        await wait_idle(pilot)
        assert app.is_running and app.main.history_panel.table.row_count == 6
        await pilot.press("f3")
        await pilot.press("x")
        await pilot.pause()
        await pilot.press("y")
        await wait_idle(pilot)
        assert len(bob.history()) == 5 and app.main.history_panel.table.row_count == 5
        assert len(bob.history_path.read_text().splitlines()) == 5


# ---------------------------------------------------------------- 2. a damaged negatives_user.jsonl
@pytest.mark.parametrize("content", [b'{"id": "caf\xe9"}\n', b"{oops\n", b"[1, 2]\n", None])
def test_a_damaged_rejected_file_keeps_the_history_and_the_fit(content: bytes | None) -> None:
    service = fitted_service()
    user = service.store.get("ann")
    path = user.dir / REJECTED_FILE
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    profile = load_profile(user, "f" * 64)
    assert profile.rejected_problem is not None and REJECTED_FILE in profile.rejected_problem
    assert "\n" not in profile.rejected_problem
    assert profile.problem is None and profile.n_history == 4 and profile.can_personalize


def test_a_rejected_file_that_is_a_fifo_is_refused_not_waited_on() -> None:
    """Read on the UI thread at start, a FIFO at negatives_user.jsonl froze the TUI for good (nothing drawn, ctrl+q
    dead), a link to /dev/zero read until memory ran out (TUI audit, eighty-fourth session)."""

    service = fitted_service()
    user = service.store.get("ann")
    path = user.dir / REJECTED_FILE

    with fed_fifo(path):
        profile = load_profile(user, "f" * 64)
    assert profile.rejected_problem is not None and "not a regular file" in profile.rejected_problem
    assert profile.problem is None and profile.can_personalize


@async_test
@pytest.mark.parametrize("damage", ["state", "cluster"])
async def test_a_state_a_fit_replaces_is_refitted_on_opening(damage: str) -> None:
    """A damaged state.json (or one naming a cluster the bundle lacks, which `localpers rewrite` refuses and the
    TUI used) was shown as damaged with the command line's advice and never refitted: the clause meant to refit
    it could not fire (TUI audit, eighty-fourth session)."""
    service = fitted_service()
    ann = service.store.get("ann")
    if damage == "state":
        ann.state_path.write_text("{", encoding="utf-8")
    else:
        set_state(ann, cluster=5)  # the fake bundle has 2
        profile = load_profile(ann, FAKE_SHA, clusters=2)
        assert (
            profile.problem is not None
            and "field 'cluster' is 5, but the bundle has 2 clusters" in profile.problem
        )
        assert not profile.can_personalize and profile.refit_mends
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        assert service.fits == ["ann"]
        assert app.profile is not None and app.profile.problem is None and app.profile.can_personalize
        assert ann.state()["cluster"] == 0


@async_test
async def test_the_app_reports_a_damaged_rejected_file_and_keeps_the_history() -> None:
    service = fitted_service()
    (service.store.get("ann").dir / REJECTED_FILE).write_bytes(b'{"id": "caf\xe9"}\n')
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        assert app.is_running and app.main.history_panel.table.row_count == 4
        assert app.profile is not None and app.profile.can_personalize
        assert any(f"{REJECTED_FILE}: not UTF-8" in notice for notice in notices(app))


# ---------------------------------------------------------------- 3. state.json's cluster
@pytest.mark.parametrize("cluster", ["two", -1, True, 1.5])
def test_a_damaged_cluster_is_a_profile_problem_as_in_the_cli(cluster: object) -> None:
    service = fitted_service()
    user = service.store.get("ann")
    set_state(user, cluster=cluster)
    profile = load_profile(user, "f" * 64)
    assert profile.problem is not None and "field 'cluster'" in profile.problem
    assert not profile.can_personalize


# ---------------------------------------------------------------- 4. ~user in the import path
def test_import_of_a_path_under_an_unknown_home_is_no_such_file() -> None:
    store = UserStore()
    with pytest.raises(LocalpersError, match=r"^~nosuchuser-localpers/h\.jsonl: no such file$"):
        import_history_file(store, "zed", "~nosuchuser-localpers/h.jsonl")
    assert store.list() == []


# ---------------------------------------------------------------- 5. the result cache key
def test_the_cache_key_includes_the_user_history_and_bias() -> None:
    from localpers.tasks import get_task

    service = fitted_service()
    ann, bob = service.store.get("ann"), service.store.get("bob")
    task = get_task("headline")

    def key(user: User, method: str = "global-history") -> tuple[object, ...]:
        profile = load_profile(user, "f" * 64)
        request, _ = personal_request(
            DRAFT, "headline", method, profile, history=user.history_index(task), strength=1.0, top_k=10
        )
        return request_key(request)

    assert key(ann) == key(ann) and key(ann) != key(bob)
    before = key(bob)
    bob.save_history(bob.history()[:-1])
    assert key(bob) != before
    card = RewriteRequest(DRAFT, "headline", "card", 0, None, 1.0, 10, bias_strength=1.0)
    assert request_key(card) != request_key(RewriteRequest(DRAFT, "headline", "card", 0, None, 1.0, 10))


@async_test
async def test_switching_user_or_removing_items_does_not_reuse_a_cached_output() -> None:
    service = fitted_service()
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        app.main.controls.method_select.value = "global-history"
        await wait_idle(pilot)
        assert app.personal_result is not None
        assert [e.output for e in app.personal_result.examples] == ["ANN 2!", "ANN 3!"]
        app.main.controls.user_select.value = "bob"
        await wait_idle(pilot)
        assert "cached" not in app.main.personal_panel.status
        assert [e.output for e in app.personal_result.examples] == ["BOB 4!", "BOB 5!"]
        bob = service.store.get("bob")
        bob.save_history(bob.history()[:-2])  # as removing two items in the History tab does
        app.refresh_user_views()
        app.regenerate()
        await wait_idle(pilot)
        assert "cached" not in app.main.personal_panel.status
        assert [e.output for e in app.personal_result.examples] == ["BOB 2!", "BOB 3!"]


# ---------------------------------------------------------------- 6. the fit's chosen strength
@async_test
async def test_alpha_starts_at_the_strength_the_fit_chose() -> None:
    service = fitted_service()
    set_state(
        service.store.get("ann"), choice={"label": "bias", "vector_strength": 0.0, "bias_strength": 1.0}
    )
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        assert app.main.controls.strength.value == 0.0
        card = [r for r in service.rewrites if r.method == "card"]
        assert card and card[-1].strength == 0.0 and card[-1].bias_strength == 1.0
        assert "α 0.00 (the fit's choice)" in str(app.main.personal_panel.border_title)
        app.main.controls.user_select.value = "bob"  # no choice stored: the bundle's default
        await wait_idle(pilot)
        assert app.main.controls.strength.value == 1.0


# ---------------------------------------------------------------- 7. a failed run
class FailingCardService(FakeService):
    def rewrite(self, request: RewriteRequest, on_text: TextSink) -> RewriteResult:
        if request.method == "card":
            raise LocalpersError("the card run broke")
        return super().rewrite(request, on_text)


@async_test
async def test_a_failed_run_leaves_no_panel_queued() -> None:
    service = fitted_service(FailingCardService)
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        assert app.main.personal_panel.status == "failed: the card run broke"
        baseline = app.main.baseline_panel
        assert baseline.text.startswith("Plain:") and baseline.complete and "queued" not in baseline.status


# ---------------------------------------------------------------- 8. Edit+accept refused
@async_test
async def test_a_refused_edit_stays_in_the_dialog_with_the_reason() -> None:
    service = fitted_service()
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        await pilot.press("ctrl+g")
        await pilot.pause()
        editor = app.screen.query_one(TextArea)
        edited = "Long " * 70  # 350 characters: a headline output has at most 300
        editor.text = edited
        await pilot.press("ctrl+s")
        await wait_idle(pilot)
        assert isinstance(app.screen, EditAcceptScreen) and editor.text == edited
        error = str(app.screen.query_one("#edit-error", Static).render())
        assert "field 'output'" in error and "at most 300" in error
        assert len(service.store.get("ann").history()) == 4
        editor.text = "Wheel Win"
        await pilot.press("ctrl+s")
        await wait_idle(pilot)
        assert app.screen is app.main and service.store.get("ann").history()[-1].output == "Wheel Win"


# ---------------------------------------------------------------- 9. a damaged active.json
@async_test
async def test_a_damaged_active_file_opens_the_first_user_with_a_notice() -> None:
    service = fitted_service()
    service.store.active_path.write_text("{not json")
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        assert not isinstance(app.screen, WelcomeScreen)
        assert app.user is not None and app.user.name == "ann"
        assert app.main.controls.user_select.value == "ann"
        assert any("active.json is damaged" in notice for notice in notices(app))


# ---------------------------------------------------------------- 10. a cut headline input
class CuttingService(FakeService):
    def rewrite(self, request: RewriteRequest, on_text: TextSink) -> RewriteResult:
        from dataclasses import replace

        result = super().rewrite(request, on_text)
        return replace(result, text_chars_read=1500) if len(request.text) > 1500 else result


@async_test
async def test_a_cut_input_is_noted_as_the_cli_does() -> None:
    service = fitted_service(CuttingService)
    app = make_app(service, text="word " * 402)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        note = (
            "note: the text has 2,009 characters; the headline task read its first 1,500 (an article's start)"
        )
        assert notices(app).count(note) == 1
        assert "read the first 1,500 characters" in app.main.baseline_panel.status


# ---------------------------------------------------------------- 11. a refused user switch
@async_test
async def test_a_refused_user_switch_puts_the_select_back(monkeypatch: pytest.MonkeyPatch) -> None:
    service = fitted_service()
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)

        def refuse(name: str) -> User:
            raise LocalpersError("cannot write active.json (Read-only file system)")

        monkeypatch.setattr(service.store, "use", refuse)
        app.main.controls.user_select.value = "bob"
        await wait_idle(pilot)
        assert app.user is not None and app.user.name == "ann"
        assert app.main.controls.user_select.value == "ann"
        assert any("Read-only" in notice for notice in notices(app))


# ---------------------------------------------------------------- 12. the quit key
@async_test
async def test_the_footer_shows_the_quit_key() -> None:
    app = make_app(fitted_service(), text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        shown = {key: active.binding for key, active in app.screen.active_bindings.items()}
        assert "ctrl+q" in shown and shown["ctrl+q"].show and shown["ctrl+q"].action == "quit"


def test_a_rejected_output_with_a_line_separator_in_its_text_reads_back() -> None:
    from localpers.tui.userdata import read_rejected, reject_output

    user = fitted_service().store.get("ann")
    draft = "First paragraph.\u2028Second paragraph.\x85Third."
    reject_output(
        user, task="headline", input_text=draft, output="A Headline", method="card", strength=None, top_k=None
    )
    assert [row.input for row in read_rejected(user)] == [draft]
    assert load_profile(user, "f" * 64).rejected_problem is None
