"""`LocalpersApp`: write a draft, see the personalized output beside the non-personalized one, see why, teach.

The app owns the behaviour; `MainScreen` owns the layout and each widget lives in its own module.

Threading. The engine is not thread-safe: every engine call (load, rewrite, fit, demo fit) is a job of
`localpers.tui.engine_jobs`, run on a daemon thread of its own (`localpers.tui.job_threads`, not a Textual
worker: quitting must not wait for the engine), holding `engine_lock` for all of its engine calls, so calls
never overlap whichever thread they come from. A newer job of a group cancels the older one (a newer
generation the older, which stops at its next streamed piece). Jobs talk back only through messages, each
generation message tagged with its job id so pieces of a superseded job are dropped.

Generation. Typing or changing a control re-generates after `debounce` seconds (ctrl+r at once, bypassing
the cache). Results are cached by what decides them (`runs.request_key`: text, task, method, the user and
their history examples, cluster, vector, token bias, α, top-k), so moving α back and forth or switching
methods does not regenerate the non-personalized output.

The app's two halves of behaviour are its bases: `GenerationMixin` (`localpers.tui.generating`: the
outputs for the draft; which request each panel gets is `localpers.tui.runs.personal_request`, which asks
the method registry) and `TeachingMixin` (`localpers.tui.teaching`: accept, edit, reject, remove, import,
and refitting); `FirstRunMixin` (`localpers.tui.first_run`) the welcome screen's choices, the demo user and
imports; `UserViewsMixin` (`localpers.tui.user_views`) the session's user and the views of them (profile,
history, header); `UserWatchMixin` (`localpers.tui.user_watch`) what other commands change in the user's folder;
`ShellMixin` (`localpers.tui.shell`) holds notices, quitting, stop signals and crash reports. This module starts
the app, picks its first user, loads the engine and wires the controls.
"""

from __future__ import annotations

import sys
import threading
import unicodedata
from collections.abc import Callable

from textual.app import App
from textual.binding import Binding
from textual.timer import Timer
from textual.widgets import Select, TextArea

from localpers import interrupts
from localpers.errors import LocalpersError
from localpers.methods.reports import RewriteResult
from localpers.tui import engine_jobs
from localpers.tui.first_run import FirstRunMixin
from localpers.tui.generating import EMPTY_DRAFT_HINT, GenerationMixin
from localpers.tui.job_threads import JobThread, JobThreads
from localpers.tui.kept_draft import kept_draft_path
from localpers.tui.messages import (
    EngineFailed,
    EngineLoaded,
    JobCrashed,
)
from localpers.tui.runs import ResultCache
from localpers.tui.screens.main import TAB_SCROLLERS, MainScreen
from localpers.tui.screens.welcome import WelcomeScreen
from localpers.tui.service import EngineInfo, WritingService
from localpers.tui.shell import ShellMixin
from localpers.tui.teaching import TeachingMixin
from localpers.tui.user_views import UserViewsMixin
from localpers.tui.user_watch import UserWatchMixin
from localpers.tui.userdata import (
    Profile,
)
from localpers.tui.widgets.stepper import Stepper
from localpers.users.store import User

DEBOUNCE_SECONDS = 0.6
REFIT_DELAY_SECONDS = 1.0
MAIN_SCREEN_ACTIONS = {
    "regenerate",
    "accept",
    "edit_accept",
    "reject",
    "refit",
    "import_history",
    "focus_draft",
    "show_tab",
}


class LocalpersApp(
    GenerationMixin, TeachingMixin, FirstRunMixin, UserViewsMixin, UserWatchMixin, ShellMixin, App[None]
):
    """The `localpers tui` application over a `WritingService`."""

    CSS_PATH = "app.tcss"
    TITLE = "localpers · F10 keys"  # the one key to learn: it lists every other

    BINDINGS = [
        Binding("ctrl+r", "regenerate", "Regenerate"),
        Binding("ctrl+s", "accept", "Accept"),
        Binding("ctrl+g", "edit_accept", "Edit"),  # then accept (short: 80 columns keep Import)
        Binding("ctrl+n", "reject", "Reject"),
        Binding("ctrl+f", "refit", "Refit"),
        Binding("ctrl+o", "import_history", "Import"),
        Binding("ctrl+q", "quit", "Quit", priority=True),  # Textual's own ctrl+q is not in the footer
        # The tab and draft titles show these keys, which keeps the footer to one line.
        Binding("f10", "toggle_help_panel", "Keys", show=False),  # named in the title bar
        Binding("escape", "hide_help_panel", "Close keys", show=False),  # only while the key list is shown
        Binding("f1", "focus_draft", "Draft", show=False),
        Binding("f2", "show_tab('why-tab')", "Why", show=False),
        Binding("f3", "show_tab('history-tab')", "History", show=False),
        Binding("f4", "show_tab('profile-tab')", "Profile", show=False),
    ]

    def __init__(
        self,
        service: WritingService,
        *,
        user: str | None = None,
        text: str = "",
        debounce: float = DEBOUNCE_SECONDS,
        refit_delay: float = REFIT_DELAY_SECONDS,
    ) -> None:
        super().__init__()
        self.service = service
        self.store = service.store
        self.requested_user = user
        self.debounce = debounce
        self.refit_delay = refit_delay
        self.main = MainScreen(text)
        self.engine_lock = threading.Lock()
        self.engine_jobs = JobThreads(on_crash=self._job_crashed)
        self.info: EngineInfo | None = None
        self.load_error: str | None = None
        self.user: User | None = None
        self.profile: Profile | None = None
        self.personal_result: RewriteResult | None = None
        self.personal_input: str | None = None
        self.fit_running = False
        self.stopped_by_signal: int | None = None
        self.draft_kept = False
        self.draft_keep_problem: str | None = None
        self.job_id = 0
        self._cache = ResultCache()
        self._cut_noted_job = 0
        self._failures_shown: dict[str, str] = {}
        self._debounce_timer: Timer | None = None
        self._refit_timer: Timer | None = None
        self._refit_timer_user: User | None = None
        self._refit_queue: list[User] = []
        self._fit_failed: dict[str, str] = {}
        self._rejected_told: dict[str, str | None] = {}
        self._strength_source: tuple[str, float | None] | None = None  # whose chosen α the stepper shows
        self._busy_noticed: set[str] = set()
        self._saved_theme: str | None = None  # the theme `tui.json` holds (`localpers.tui.settings`)

    # ------------------------------------------------------------------ start-up
    def get_default_screen(self) -> MainScreen:
        return self.main

    def on_mount(self) -> None:
        self._stop_on_signals()
        self._restore_theme()
        self.call_after_refresh(self.start)

    def start(self) -> None:
        """Load the engine in the background, then open the user (or the first-run welcome), with the draft a stop
        signal kept if the command gave no text."""
        self._reopen_kept_draft()
        self.sub_title = "loading the model…"
        self.main.progress.start("loading the model")
        self.main.personal_panel.clear(EMPTY_DRAFT_HINT)
        self.main.baseline_panel.clear(EMPTY_DRAFT_HINT)
        self._run_engine_job("load", engine_jobs.load_engine)
        chosen = self._first_user()
        if chosen is None:
            self.push_screen(WelcomeScreen(), self._after_welcome)
        else:
            self.select_user(chosen)
        self.main.draft.focus()
        self.set_interval(self.user_watch_seconds, self.watch_user_files)

    def _first_user(self) -> str | None:
        """The requested user, else the active one, else the first listed; a damaged active.json is
        reported and treated as no active user."""
        try:
            names = self.store.list()
        except LocalpersError as exc:
            self.notify(str(exc), severity="error", timeout=10)
            return self.requested_user
        if self.requested_user is not None:
            return self.requested_user
        try:
            active = self.store.active_name()
        except LocalpersError as exc:
            self.notify(str(exc), severity="error", timeout=10)
            active = None
        return active or (names[0] if names else None)

    # ------------------------------------------------------------------ accessors
    @property
    def draft_text(self) -> str:
        """The draft as it is measured, cut, generated from and stored: NFC, as history items are (a pasted
        decomposed text must still match the input its output was made for)."""
        return unicodedata.normalize("NFC", self.main.draft.text)

    @property
    def busy(self) -> bool:
        """True while a generation or fit is pending or running (tests wait for this to clear)."""
        return (
            self._debounce_timer is not None
            or self._refit_timer is not None
            or self.fit_running
            or self.engine_jobs.any_running
        )

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The main screen's actions are off while a dialog is open; Escape closes only a shown key list
        (else it goes on to the focused widget or dialog)."""
        if action == "hide_help_panel":
            return self._help_panel_shown()
        return not (action in MAIN_SCREEN_ACTIONS and self.screen is not self.main)

    # ------------------------------------------------------------------ engine loading
    def _run_engine_job(self, group: str, job: Callable[..., None], *args: object) -> None:
        """Run `job(thread, service, engine_lock, post_message, *args)` on a job thread; it cancels the group's
        older jobs."""

        def work(thread: JobThread) -> None:
            job(thread, self.service, self.engine_lock, self.post_message, *args)

        self.engine_jobs.start(group, job.__name__, work)

    def _job_crashed(self, job: JobThread, error: Exception) -> None:
        """A job's own defect (its engine errors are messages): said in a notice, from the job's thread."""
        self.post_message(JobCrashed(f"{job.name}: {type(error).__name__}: {error}"))

    def on_job_crashed(self, message: JobCrashed) -> None:
        if self.is_running:
            self.notify(message.description, title="An engine job failed", severity="error", timeout=30)

    def on_engine_loaded(self, message: EngineLoaded) -> None:
        if not self.is_running:  # a worker's message arriving while the app shuts down
            return
        self.info = message.info
        if not self.fit_running:
            self.main.progress.stop()
        controls = self.main.controls
        controls.set_methods(message.info.methods)
        with controls.strength.prevent(Stepper.Changed), controls.top_k.prevent(Stepper.Changed):
            controls.strength.set_value(message.info.default_strength)
            controls.top_k.set_value(message.info.default_top_k)
        self.refresh_user_views()
        if not self.start_queued_refit():  # ctrl+f pressed while the model loaded: that fit, else one if due
            self.maybe_refit()
        self.regenerate()

    def on_engine_failed(self, message: EngineFailed) -> None:
        if not self.is_running:  # a worker's message arriving while the app shuts down
            return
        self.main.progress.stop()
        self.load_error = message.error
        self.sub_title = "the model could not be loaded"
        for target in ("baseline", "personal"):
            self.main.panel(target).fail(message.error)
        self.notify(message.error, title="Model", severity="error", timeout=30)

    # ------------------------------------------------------------------ generation
    def on_text_area_changed(self, event: TextArea.Changed) -> None:
        if event.text_area is self.main.draft:
            self.schedule_generation()

    def on_select_changed(self, event: Select.Changed) -> None:
        select_id = event.select.id
        if select_id == "user":
            self.switch_user(event.value)
        elif select_id in ("task", "method"):
            self.main.controls.enable_tuning_for_method()
            self.schedule_generation()

    def on_stepper_changed(self, event: Stepper.Changed) -> None:
        self.schedule_generation()

    # ------------------------------------------------------------------ navigation
    def action_focus_draft(self) -> None:
        self.main.draft.focus()

    def action_show_tab(self, tab: str) -> None:
        self.main.tabs.active = tab
        pane = self.main.tabs.get_pane(tab)
        focusable = [widget for widget in pane.query("*") if widget.focusable]
        # a control of the tab (the token strip, the history table) before the container that scrolls the tab
        controls = [widget for widget in focusable if widget.id not in TAB_SCROLLERS]
        if controls or focusable:
            (controls or focusable)[0].focus()

    # ------------------------------------------------------------------ shutdown
    def close_service(
        self, timeout: float = 60.0, *, on_wait: Callable[[], None] | None = None, patience: float = 0.5
    ) -> bool:
        """After the app has exited: cancel the engine's jobs, wait for the engine to be free, then close it.

        A job stops at its next check, which a step of the engine (loading a model, a CoPe fit's torch load)
        can hold off for seconds: after `patience` seconds `on_wait` is called (the command says why it has not
        ended yet) and the wait goes on up to `timeout`. Past it the engine is left to the process's end, still
        in use (freeing it under the job would crash). Returns whether the engine was closed."""
        self.engine_jobs.cancel_all()
        free = self.engine_lock.acquire(timeout=min(patience, timeout))
        if not free:
            if on_wait is not None:
                on_wait()
            free = self.engine_lock.acquire(timeout=max(timeout - patience, 0.0))
        if not free:
            return False
        try:
            self.service.close()
        finally:
            self.engine_lock.release()
        return True


def _say_waiting() -> None:
    print(
        "localpers: waiting for the model's current step to end before closing it (Ctrl-C leaves at once)",
        file=sys.stderr,
        flush=True,
    )


def run_app(service: WritingService, *, user: str | None = None, text: str = "") -> None:
    """Run the TUI until the user quits, then close the engine once no job uses it (`close_service`: after 60 s of
    waiting for a job's step it is left to the process's end)."""
    app = LocalpersApp(service, user=user, text=text)
    try:
        app.run()
    finally:
        # The app's loop set SIGTERM/SIGHUP back to the default when it closed: ours again, so a stop while the
        # engine closes still ends cleanly.
        interrupts.install_stop_handlers()
        app.close_service(on_wait=_say_waiting)
    if app.draft_kept:
        print(
            f"localpers: your draft was kept in {kept_draft_path()}; the next `localpers tui` opens with it",
            file=sys.stderr,
        )
    elif app.draft_keep_problem:
        print(f"localpers: {app.draft_keep_problem}", file=sys.stderr)
    if app.stopped_by_signal is not None:  # the command line reports it and exits 128 + its number
        raise interrupts.Terminated(app.stopped_by_signal)
