"""Pilot and unit tests of TUI edges a new user and a hostile tester met (eighty-second session's audit): an import
whose user cannot be made active, a decomposed draft, an import while the demo user is prepared, a refused
generation's whole reason, the key list, a fit asked for while the model loads, a damaged history in the header,
how long the user's files are waited for, and the hints the import dialog gives."""

from __future__ import annotations

import json
import threading
import time
import unicodedata
from pathlib import Path

import pytest
from test_tui_damage import fitted_service, notices
from textual.widgets import HelpPanel
from tui_fakes import FakeService
from tui_helpers import DRAFT, SIZE, async_test, make_app, wait_idle

from localpers.errors import LocalpersError, UserBusy
from localpers.methods.reports import RewriteResult
from localpers.tui.app import LocalpersApp
from localpers.tui.first_run import first_demo_article
from localpers.tui.runs import personal_request
from localpers.tui.screens.import_history import ImportScreen
from localpers.tui.service import EngineInfo, RewriteRequest, TextSink
from localpers.tui.userdata import Profile, accept_output, import_history_file
from localpers.users.history import MAX_HISTORY_ITEMS
from localpers.users.store import User, UserStore


def history_file(path: Path, count: int, prefix: str = "Mine") -> Path:
    path.write_text(
        "\n".join(json.dumps({"input": f"article {i}", "output": f"{prefix} {i}"}) for i in range(count))
    )
    return path


async def import_through_the_dialog(pilot, app: LocalpersApp, path: Path, user: str) -> None:  # type: ignore[no-untyped-def]
    await pilot.press("ctrl+o")
    await pilot.pause()
    screen = app.screen
    assert isinstance(screen, ImportScreen)
    screen.path_input.value = str(path)
    screen.user_input.value = user
    screen.run_import()
    await pilot.pause()


@async_test
async def test_an_imported_user_that_cannot_be_made_active_is_a_notice_not_a_crash(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The import's switch to its user was the one `store.use` without a guard: a full disk there ended the app
    with a traceback."""
    service = fitted_service()
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_idle(pilot)

        def refuse(name: str) -> User:
            raise LocalpersError("cannot write active.json (No space left on device)")

        monkeypatch.setattr(service.store, "use", refuse)
        await import_through_the_dialog(pilot, app, history_file(tmp_path / "mine.jsonl", 3), "cy")
        await wait_idle(pilot)
        assert app.is_running and app.screen is app.main
        assert (
            app.user is not None and app.user.name == "ann"
        )  # the session keeps its user, as the CLI's does
        assert "cy" in service.store.list() and len(service.store.get("cy").history()) == 3
        assert any(
            "'cy' could not be made the active user" in n and "No space left" in n for n in notices(app)
        )
        # no fit starts for a user the session cannot switch to, and the notice said "fitting…" (ninety-first
        # session's audit)
        told = [notice for notice in notices(app) if notice.startswith("Imported")]
        assert told and all("fitting" not in notice for notice in told), told
        assert any("choose 'cy' in the User list to fit it" in notice for notice in told), told
        assert "cy" not in service.fits


@async_test
async def test_a_decomposed_draft_can_be_accepted() -> None:
    """Text pasted in decomposed form (NFD: macOS, some input methods) never matched the NFC input its output was
    made for, so accept, edit and reject all said "no finished output" however long one waited."""
    service = fitted_service()
    draft = unicodedata.normalize("NFD", "Café in Zürich reopens as a crêperie")
    assert draft != unicodedata.normalize("NFC", draft)
    app = make_app(service, text=draft)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_idle(pilot)
        await pilot.press("ctrl+s")
        await wait_idle(pilot)
        added = service.store.get("ann").history()[-1]
        assert added.input == unicodedata.normalize("NFC", draft)
        assert not any("No finished output" in n for n in notices(app))


class SlowDemoService(FakeService):
    """Prepares the demo user only once `demo_gate` is set."""

    def __init__(self, store: UserStore) -> None:
        super().__init__(store)
        self.demo_gate = threading.Event()

    def ensure_demo_user(self, progress):  # type: ignore[no-untyped-def]
        self.demo_gate.wait(timeout=10)
        return super().ensure_demo_user(progress)


@async_test
async def test_a_history_imported_while_the_demo_is_prepared_stays_the_user(tmp_path: Path) -> None:
    """The demo's end switched the session to the demo user over the one just imported (the active user on disk
    stayed the import's), and the imported user's fit, queued behind the demo's, never ran."""
    service = SlowDemoService(UserStore())
    app = make_app(service)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.pause()
        await pilot.press("d")  # the welcome screen's demo user
        await pilot.pause()
        await import_through_the_dialog(pilot, app, history_file(tmp_path / "mine.jsonl", 3), "me")
        service.demo_gate.set()
        await wait_idle(pilot)
        assert app.user is not None and app.user.name == "me" and service.store.active_name() == "me"
        assert "me" in service.fits
        assert app.profile is not None and app.profile.can_personalize
        assert any("The demo user is ready" in n for n in notices(app))


@async_test
async def test_cancelling_an_import_while_the_demo_is_prepared_does_not_bring_the_welcome_back() -> None:
    """The welcome screen came back over the demo's preparation, and its Escape (closing what looked like a left
    dialog) quit the app (TUI audit, eighty-fourth session)."""
    service = SlowDemoService(UserStore())
    app = make_app(service)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("d")
        await pilot.pause()
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert isinstance(app.screen, ImportScreen)
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is app.main
        await pilot.press("escape")
        await pilot.pause()
        assert app.is_running
        service.demo_gate.set()
        await wait_idle(pilot)
        assert app.user is not None and app.user.name == "demo"


@async_test
async def test_importing_only_items_already_there_writes_nothing_and_fits_nothing(tmp_path: Path) -> None:
    """The dialog rewrote the history (dropping the engine's kept states) and ran a whole fit, saying "fitting…",
    for a file whose every item was there; the command line writes nothing (TUI audit)."""
    service = fitted_service()
    ann = service.store.get("ann")
    again = tmp_path / "again.jsonl"
    again.write_text(
        "".join(json.dumps({"input": i.input, "output": i.output}) + "\n" for i in ann.history()),
        encoding="utf-8",
    )
    kept = ann.dir / "prefix-0123456789abcdef0123456789abcdef.kv"
    kept.write_bytes(b"an engine state")
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_idle(pilot)
        before = ann.history_path.stat()
        service.fits.clear()
        await import_through_the_dialog(pilot, app, again, "ann")
        await wait_idle(pilot)
        assert ann.history_path.stat().st_ino == before.st_ino and kept.exists()
        assert service.fits == []
        assert any("Imported 0 items" in n and "fitting" not in n for n in notices(app))


LONG_REASON = (
    "the text has 1,199 characters; the paraphrase task reads at most 1,000: split it into parts of up to"
    " 1,000 characters and rewrite each, or choose the headline task, which reads the start of a long text"
)


class RefusingService(FakeService):
    def rewrite(self, request: RewriteRequest, on_text: TextSink) -> RewriteResult:
        raise LocalpersError(LONG_REASON)


@async_test
async def test_a_refused_generation_says_its_whole_reason() -> None:
    """The reason showed only in the panel's border, cut at its width ("failed: the text has 1,199 charac…"), and
    accept then said "wait for it or press ctrl+r", which could not help."""
    app = make_app(fitted_service(RefusingService), text=DRAFT)
    async with app.run_test(size=(80, 30), notifications=True) as pilot:
        await wait_idle(pilot)
        told = [n for n in notices(app) if LONG_REASON in n]
        assert len(told) == 1  # once, although both outputs failed
        assert app.main.personal_panel.placeholder == LONG_REASON  # whole, in the panel's body
        assert app.main.personal_panel.status == f"failed: {LONG_REASON}"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert any(n.startswith("No output to keep: the text has 1,199 characters") for n in notices(app))


@async_test
async def test_f10_and_escape_close_the_key_list() -> None:
    app = make_app(fitted_service(), text=DRAFT)
    async with app.run_test(size=SIZE) as pilot:
        await wait_idle(pilot)
        await pilot.press("f10")
        await pilot.pause()
        assert app.screen.query(HelpPanel)
        await pilot.press("f10")
        await pilot.pause()
        assert not app.screen.query(HelpPanel)
        await pilot.press("f10")
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()
        assert not app.screen.query(HelpPanel)
        app.main.draft.focus()
        await pilot.press("escape", *"ok")  # without the key list Escape is the focused widget's
        await pilot.pause()
        assert app.is_running and "ok" in app.main.draft.text and app.focused is app.main.draft


class SlowLoadService(FakeService):
    """Loads the model only once `load_gate` is set."""

    def __init__(self, store: UserStore) -> None:
        super().__init__(store)
        self.load_gate = threading.Event()

    def load(self) -> EngineInfo:
        self.load_gate.wait(timeout=10)
        return super().load()


@async_test
async def test_a_fit_asked_for_while_the_model_loads_runs_once_it_has_loaded() -> None:
    """ctrl+f during loading said "the fit starts when it is ready", and no fit started for a user already
    fitted; the personalized panel meanwhile called that user "not fitted"."""
    service = fitted_service(SlowLoadService)
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.pause(0.2)
        assert app.info is None
        assert "waiting for the model" in str(app.main.personal_panel.border_title)
        await pilot.press("ctrl+f")
        await pilot.pause()
        assert any("the fit starts when it is ready" in n for n in notices(app))
        service.load_gate.set()
        await wait_idle(pilot)
        assert service.fits == ["ann"]


def test_the_personal_title_says_not_fitted_only_once_the_fit_could_be_matched() -> None:
    fit = {"mode": "vector", "n_items": 4}
    loading = Profile("ann", 4, cluster=0, fit=fit, bundle_matches=None)
    other_bundle = Profile("ann", 4, cluster=0, fit=fit, bundle_matches=False)
    never = Profile("ann", 4, bundle_matches=None)
    titles = {}
    for name, profile in (("loading", loading), ("other", other_bundle), ("never", never)):

        class History:
            pool = [("an input", "AN OUTPUT")]

        _, titles[name] = personal_request(
            DRAFT, "headline", "card", profile, history=History(), strength=1, top_k=10
        )  # type: ignore[arg-type]
    assert titles["loading"].endswith("· waiting for the model")
    assert titles["other"].endswith("· not fitted") and titles["never"].endswith("· not fitted")


@async_test
async def test_a_damaged_history_is_named_in_the_header_not_a_cold_start() -> None:
    service = fitted_service()
    service.store.get("ann").history_path.write_text("garbage\n")
    app = make_app(service, text=DRAFT)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_idle(pilot)
        assert "cannot be read" in str(app.sub_title) and "cold start" not in str(app.sub_title)
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert any(n.startswith("No output to keep:") and "history.jsonl line 1" in n for n in notices(app))


def test_an_accept_waits_only_briefly_for_another_hold_on_the_user() -> None:
    """The UI thread waited up to 60 s (the command line's wait) for another command's hold on the user."""
    user = fitted_service().store.get("ann")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with user.locked():
            held.set()
            release.wait(timeout=20)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        held.wait(timeout=5)
        started = time.monotonic()
        with pytest.raises(UserBusy, match="is busy"):
            accept_output(user, "headline", "A new article", "A New Headline")
        assert time.monotonic() - started < 15
    finally:
        release.set()
        holder.join()
    assert accept_output(user, "headline", "A new article", "A New Headline")[1]


def test_the_import_dialog_names_the_terminal_command_for_a_long_file(tmp_path: Path) -> None:
    """It suggested `--keep-latest 500`, an option the dialog does not have."""
    long = history_file(tmp_path / "long file.jsonl", MAX_HISTORY_ITEMS + 1)
    with pytest.raises(LocalpersError) as refused:
        import_history_file(UserStore(), "cy", long)
    message = str(refused.value)
    assert (
        f"from a terminal: `localpers history import '{long}' --keep-latest {MAX_HISTORY_ITEMS} --user cy`"
        in message
    )


def test_the_import_dialog_names_the_terminal_command_for_a_file_of_several_users(tmp_path: Path) -> None:
    """It said "choose one with --user-id", an option the dialog does not have (TUI audit, eighty-fourth session)."""
    shared = tmp_path / "shared.jsonl"
    lines = [
        {"user_id": uid, "history": [{"input": f"{uid} article", "output": f"{uid} headline"}]}
        for uid in "ab"
    ]
    shared.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    with pytest.raises(LocalpersError) as refused:
        import_history_file(UserStore(), "cy", shared)
    message = str(refused.value)
    assert "holds 2 users (a, b)" in message
    assert f"from a terminal: `localpers history import {shared} --user-id ID --user cy`" in message


def test_the_demo_draft_is_the_article_without_the_corpus_instruction() -> None:
    article = first_demo_article()
    assert article is not None and not article.startswith("Generate a headline")
    assert article.startswith("The regional rail operator")


@async_test
async def test_a_refusal_that_persists_is_told_once_while_it_lasts() -> None:
    """The notice was per generation: a draft the paraphrase task could not carry popped a new 15-second error at
    every pause in typing (session review)."""
    app = make_app(fitted_service(RefusingService), text=DRAFT)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_idle(pilot)
        app.main.draft.focus()
        await pilot.press("end", *" more")
        await wait_idle(pilot)
        assert len([n for n in notices(app) if LONG_REASON in n]) == 1
        assert app.main.personal_panel.placeholder == LONG_REASON
