"""`LocalpersApp`: write a draft, see the personalized output beside the non-personalized one, see why, teach.

The app owns the behaviour; `MainScreen` owns the layout and each widget lives in its own module.

Threading. The engine is not thread-safe: every engine call (load, rewrite, fit, demo fit) is a job of
`localpers.tui.engine_jobs`, run in a Textual thread worker, holding `engine_lock` for all of its engine
calls, so calls never overlap whichever worker they come from. A newer generation cancels the older worker
(`exclusive=True`), which stops at its next streamed piece. Jobs talk back only through messages, each
generation message tagged with its job id so pieces of a superseded job are dropped.

Generation. Typing or changing a control re-generates after `debounce` seconds (ctrl+r at once, bypassing
the cache). Results are cached by (text, task, method, cluster, vector, α, top-k), so moving α back and
forth or switching methods does not regenerate the non-personalized output.

Teaching. Accepting (or editing and accepting) adds `(draft, output)` to the user's history, rejecting
keeps the output in the user's `negatives_user.jsonl`; a refit then runs in the background with a progress
bar and the profile, header and personalized output update when it ends.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

from textual.app import App
from textual.binding import Binding
from textual.timer import Timer
from textual.widgets import Select, TextArea

from localpers.errors import LocalpersError
from localpers.methods.card.personalizer import RewriteResult
from localpers.tasks import get_task
from localpers.tui import engine_jobs
from localpers.tui.messages import (
    DemoReady,
    EngineFailed,
    EngineLoaded,
    FitDone,
    FitProgressed,
    GenerationDone,
    GenerationFailed,
    GenerationPiece,
    GenerationStarted,
)
from localpers.tui.runs import ResultCache, plan_runs, result_status
from localpers.tui.screens.confirm import ConfirmScreen
from localpers.tui.screens.edit_accept import EditAcceptScreen
from localpers.tui.screens.import_history import ImportScreen
from localpers.tui.screens.main import MainScreen
from localpers.tui.screens.welcome import WelcomeScreen
from localpers.tui.service import BASELINE_METHOD, EngineInfo, RewriteRequest, WritingService
from localpers.tui.userdata import (
    ImportSummary,
    Profile,
    accept_output,
    load_profile,
    reject_output,
    remove_history_item,
)
from localpers.tui.widgets.history_panel import HistoryPanel
from localpers.tui.widgets.stepper import Stepper
from localpers.users.store import User

DEBOUNCE_SECONDS = 0.6
REFIT_DELAY_SECONDS = 1.0
EMPTY_DRAFT_HINT = "The output appears here as you write."
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


class LocalpersApp(App[None]):
    """The `localpers tui` application over a `WritingService`."""

    CSS_PATH = "app.tcss"
    TITLE = "localpers"

    BINDINGS = [
        Binding("ctrl+r", "regenerate", "Regenerate"),
        Binding("ctrl+s", "accept", "Accept"),
        Binding("ctrl+g", "edit_accept", "Edit+accept"),
        Binding("ctrl+n", "reject", "Reject"),
        Binding("ctrl+f", "refit", "Refit"),
        Binding("ctrl+o", "import_history", "Import"),
        # The tab and draft titles show these keys, which keeps the footer to one line.
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
        self.info: EngineInfo | None = None
        self.load_error: str | None = None
        self.user: User | None = None
        self.profile: Profile | None = None
        self.personal_result: RewriteResult | None = None
        self.personal_input: str | None = None
        self.fit_running = False
        self.job_id = 0
        self._cache = ResultCache()
        self._debounce_timer: Timer | None = None
        self._refit_timer: Timer | None = None
        self._refit_again = False
        self._fit_failed: set[str] = set()

    # ------------------------------------------------------------------ start-up
    def get_default_screen(self) -> MainScreen:
        return self.main

    def on_mount(self) -> None:
        self.call_after_refresh(self.start)

    def start(self) -> None:
        """Load the engine in the background, then open the user (or the first-run welcome)."""
        self.sub_title = "loading the model…"
        self.main.progress.start("loading the model")
        self.main.personal_panel.clear(EMPTY_DRAFT_HINT)
        self.main.baseline_panel.clear(EMPTY_DRAFT_HINT)
        self._run_engine_job("load", engine_jobs.load_engine)
        try:
            names = self.store.list()
            chosen = self.requested_user or self.store.active_name() or (names[0] if names else None)
        except LocalpersError as exc:
            self.notify(str(exc), severity="error", timeout=10)
            names, chosen = [], None
        if chosen is None:
            self.push_screen(WelcomeScreen(), self._after_welcome)
        else:
            self.select_user(chosen)
        self.main.draft.focus()

    def _after_welcome(self, choice: str | None) -> None:
        if choice == "demo":
            self.main.progress.start("preparing the demo user")
            self.fit_running = True
            self._run_engine_job("fit", engine_jobs.prepare_demo)
        elif choice == "import":
            self.push_screen(ImportScreen(self.store, None), self._after_import)
        else:
            self.exit()

    def _after_import(self, summary: ImportSummary | None) -> None:
        if summary is None:
            if self.user is None:  # first run: back to the choice
                self.push_screen(WelcomeScreen(), self._after_welcome)
            return
        self.notify(
            f"Imported {summary.added} items into {summary.user!r} ({summary.total} in all"
            f"{f', {summary.skipped} duplicates skipped' if summary.skipped else ''}); fitting…"
        )
        if self.user is None or self.user.name != summary.user:
            self.store.use(summary.user)
            self.select_user(summary.user)
        else:
            self.refresh_user_views()
            self.start_refit()

    # ------------------------------------------------------------------ accessors
    @property
    def draft_text(self) -> str:
        return self.main.draft.text

    @property
    def busy(self) -> bool:
        """True while a generation or fit is pending or running (tests wait for this to clear)."""
        return (
            self._debounce_timer is not None
            or self._refit_timer is not None
            or self.fit_running
            or any(worker.is_running for worker in self.workers)
        )

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The main screen's actions are off while a dialog is open."""
        return not (action in MAIN_SCREEN_ACTIONS and self.screen is not self.main)

    # ------------------------------------------------------------------ users and profile
    def select_user(self, name: str) -> None:
        """Make `name` the user of this session: profile, panels, refit if due, personalized output."""
        try:
            user = self.store.get(name)
        except LocalpersError as exc:
            self.notify(str(exc), severity="error", timeout=10)
            return
        self.user = user
        self.main.controls.set_users(self.store.list(), name)
        self.refresh_user_views()
        self.maybe_refit()
        self.regenerate()

    def refresh_user_views(self) -> None:
        """Re-read the user's folder into the profile, history and profile panels and the header."""
        if self.user is None:
            self.profile = None
            self.main.history_panel.show(None, [])
            self.main.profile_panel.profile = None
            self.sub_title = "no user"
            return
        try:
            items = self.user.history()
            self.profile = load_profile(self.user, self.info.bundle_sha256 if self.info else None)
        except LocalpersError as exc:
            self.notify(str(exc), severity="error", timeout=10)
            items, self.profile = [], Profile(self.user.name, 0, problem=str(exc))
        self.main.history_panel.show(self.user.name, items)
        self.main.profile_panel.profile = self.profile
        self.sub_title = self._header_line()

    def _header_line(self) -> str:
        profile = self.profile
        if profile is None:
            return "no user"
        parts = [f"user {profile.user}", f"{profile.n_history} examples"]
        if profile.can_personalize:
            parts.append(f"cluster {profile.cluster}")
        elif profile.n_history == 0:
            parts.append("cold start")
        if self.info is None:
            parts.append("loading the model…")
        return " · ".join(parts)

    # ------------------------------------------------------------------ engine loading
    def _run_engine_job(self, group: str, job: Callable[..., None], *args: object) -> None:
        """Run `job(service, engine_lock, post_message, *args)` in a thread worker; newer jobs cancel older."""
        work = functools.partial(job, self.service, self.engine_lock, self.post_message, *args)
        self.run_worker(
            work, name=job.__name__, group=group, thread=True, exclusive=True, exit_on_error=False
        )

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
            name = event.value
            if isinstance(name, str) and (self.user is None or name != self.user.name):
                try:
                    self.store.use(name)
                except LocalpersError as exc:
                    self.notify(str(exc), severity="error")
                    return
                self.select_user(name)
        elif select_id in ("task", "method"):
            self.main.controls.set_card_controls_enabled(self.main.controls.method == "card")
            self.schedule_generation()

    def on_stepper_changed(self, event: Stepper.Changed) -> None:
        self.schedule_generation()

    def schedule_generation(self) -> None:
        """Regenerate once the user has paused for `debounce` seconds."""
        if self._debounce_timer is not None:
            self._debounce_timer.stop()
        self._debounce_timer = self.set_timer(self.debounce, self.regenerate)

    def action_regenerate(self) -> None:
        self.regenerate(force=True)

    def _personal_request(self, text: str, task: str) -> tuple[RewriteRequest, str]:
        """The personalized request for the chosen method, and the panel title saying what it is."""
        controls = self.main.controls
        method = controls.method
        profile = self.profile
        if method == BASELINE_METHOD:
            return RewriteRequest(text, task, BASELINE_METHOD), "Personalized · global (not personalized)"
        if profile is None or not profile.can_personalize:
            why = "no user" if profile is None else "no fitted profile yet"
            return RewriteRequest(text, task, BASELINE_METHOD), f"Personalized · {why}: global adapter"
        history = self.user.history_index(get_task(task)) if self.user is not None else None
        if method == "cluster":
            request = RewriteRequest(text, task, "cluster", cluster=profile.cluster, history=history)
            return request, f"Personalized · cluster {profile.cluster} adapter"
        strength, top_k = controls.strength.value, int(controls.top_k.value)
        request = RewriteRequest(
            text,
            task,
            "card",
            cluster=profile.cluster,
            vector=profile.vector,
            strength=strength,
            top_k=top_k,
            record_steps=True,
            history=history,
            bias=profile.bias,
            bias_strength=profile.bias_strength,
        )
        return request, f"Personalized · CARD · cluster {profile.cluster} · α {strength:.2f} · top-{top_k}"

    def regenerate(self, force: bool = False) -> None:
        """Show both outputs for the current draft: from the cache, or by starting a generation job."""
        if self._debounce_timer is not None:
            self._debounce_timer.stop()
            self._debounce_timer = None
        main = self.main
        text = self.draft_text
        self.job_id += 1
        if not text.strip():
            self.workers.cancel_group(self, "generate")
            main.baseline_panel.clear(EMPTY_DRAFT_HINT)
            main.personal_panel.clear(EMPTY_DRAFT_HINT)
            self._set_personal(None, None)
            return
        task = main.controls.task
        personal, title = self._personal_request(text, task)
        main.personal_panel.border_title = title
        baseline = RewriteRequest(text, task, BASELINE_METHOD)
        cached, runs = plan_runs([("personal", personal), ("baseline", baseline)], self._cache, force=force)
        for target, result in cached.items():
            main.panel(target).finish(result.text, result_status(result, cached=True))
            if target == "personal":
                self._set_personal(result, text)
        if not runs:
            self.workers.cancel_group(self, "generate")
            return
        if self.load_error is not None:
            for run in runs:
                for target in run.targets:
                    main.panel(target).fail(self.load_error)
            return
        waiting = (
            "waiting for the model to load…"
            if self.info is None
            else ("waiting for the refit to finish…" if self.fit_running else "queued…")
        )
        for run in runs:
            for target in run.targets:
                main.panel(target).begin(waiting)
                if target == "personal":
                    self._set_personal(None, None)
        if self.info is not None:
            self._run_engine_job("generate", engine_jobs.generate, self.job_id, tuple(runs))
        # else: on_engine_loaded calls regenerate again

    def on_generation_started(self, message: GenerationStarted) -> None:
        if not self.is_running:  # a worker's message arriving while the app shuts down
            return
        if message.job == self.job_id:
            for target in message.targets:
                self.main.panel(target).begin("generating…")

    def on_generation_piece(self, message: GenerationPiece) -> None:
        if not self.is_running:  # a worker's message arriving while the app shuts down
            return
        if message.job == self.job_id:
            for target in message.targets:
                self.main.panel(target).append(message.piece)

    def on_generation_done(self, message: GenerationDone) -> None:
        if not self.is_running:  # a worker's message arriving while the app shuts down
            return
        self._cache.put(message.key, message.result)
        if message.job != self.job_id:
            return
        for target in message.targets:
            self.main.panel(target).finish(message.result.text, result_status(message.result))
        if "personal" in message.targets:
            self._set_personal(message.result, message.request.text)

    def on_generation_failed(self, message: GenerationFailed) -> None:
        if not self.is_running:  # a worker's message arriving while the app shuts down
            return
        if message.job == self.job_id:
            for target in message.targets:
                self.main.panel(target).fail(message.error)

    def _set_personal(self, result: RewriteResult | None, input_text: str | None) -> None:
        self.personal_result = result
        self.personal_input = input_text
        self.main.why.show(result)

    # ------------------------------------------------------------------ teaching
    def _finished_output(self) -> RewriteResult | None:
        """The personalized output for the current draft, or None (with a notice saying why)."""
        if self.user is None:
            self.notify("Choose or create a user first (ctrl+o imports a history file).", severity="warning")
            return None
        result = self.personal_result
        if result is None or self.personal_input != self.draft_text or not result.text.strip():
            self.notify(
                "No finished output for this draft yet: wait for it or press ctrl+r.", severity="warning"
            )
            return None
        return result

    def action_accept(self) -> None:
        result = self._finished_output()
        if result is not None:
            self.accept_text(result.text)

    def action_edit_accept(self) -> None:
        result = self._finished_output()
        if result is not None:
            self.push_screen(EditAcceptScreen(result.text), self._after_edit)

    def _after_edit(self, edited: str | None) -> None:
        if edited is not None:
            self.accept_text(edited)

    def accept_text(self, accepted: str) -> None:
        """Add (draft, accepted) to the user's history and refit in the background."""
        if self.user is None or self.personal_result is None or self.personal_input is None:
            return
        try:
            item, added = accept_output(self.user, self.personal_result.task, self.personal_input, accepted)
        except LocalpersError as exc:
            self.notify(str(exc), severity="error", timeout=10)
            return
        if not added:
            self.notify(f"Already in {self.user.name}'s history as {item.id}; nothing added.")
            return
        self.refresh_user_views()
        count = self.profile.n_history if self.profile else 0
        self.notify(f"Added to {self.user.name}'s history ({count} examples); refitting in the background.")
        self.schedule_refit()

    def action_reject(self) -> None:
        result = self._finished_output()
        if result is None or self.user is None or self.personal_input is None:
            return
        try:
            _, added = reject_output(
                self.user,
                task=result.task,
                input_text=self.personal_input,
                output=result.text,
                method=result.method,
                strength=result.strength,
                top_k=result.top_k,
            )
        except LocalpersError as exc:
            self.notify(str(exc), severity="error", timeout=10)
            return
        self.refresh_user_views()
        if added:
            self.notify(f"Kept as a rejected output in {self.user.name}'s folder (not added to the history).")
        else:
            self.notify("This output was already rejected.")

    def on_history_panel_remove_requested(self, message: HistoryPanel.RemoveRequested) -> None:
        item_id = message.item_id

        def remove(confirmed: bool | None) -> None:
            if not confirmed or self.user is None:
                return
            try:
                item = remove_history_item(self.user, item_id)
            except LocalpersError as exc:
                self.notify(str(exc), severity="error")
                return
            self.refresh_user_views()
            self.notify(f"Removed {item.id} from {self.user.name}'s history; refitting in the background.")
            self.schedule_refit()

        self.push_screen(ConfirmScreen(f"Remove history item {item_id} and refit?"), remove)

    def action_import_history(self) -> None:
        self.push_screen(ImportScreen(self.store, self.user.name if self.user else None), self._after_import)

    # ------------------------------------------------------------------ fitting
    def maybe_refit(self) -> None:
        """Refit when the profile is due (no fit, another bundle, history changed) and it has not failed."""
        profile = self.profile
        if (
            self.info is not None
            and profile is not None
            and profile.bundle_matches is not None
            and (profile.needs_fit or profile.problem is not None)
            and profile.user not in self._fit_failed
        ):
            self.start_refit()

    def schedule_refit(self) -> None:
        """Refit after `refit_delay` seconds, so several accepts or removals share one fit."""
        if self._refit_timer is not None:
            self._refit_timer.stop()
        self._refit_timer = self.set_timer(self.refit_delay, self.start_refit)

    def action_refit(self) -> None:
        if self.user is not None:
            self._fit_failed.discard(self.user.name)
        self.start_refit()

    def start_refit(self) -> None:
        if self._refit_timer is not None:
            self._refit_timer.stop()
            self._refit_timer = None
        if self.user is None:
            self.notify("No user to fit yet.", severity="warning")
            return
        if self.info is None:
            message = self.load_error or "The model is still loading; the fit starts when it is ready."
            self.notify(message, severity="error" if self.load_error else "information")
            return
        if self.fit_running:
            self._refit_again = True
            return
        self.fit_running = True
        self.main.progress.start(f"fitting {self.user.name}")
        self._run_engine_job("fit", engine_jobs.fit, self.user)

    def on_fit_progressed(self, message: FitProgressed) -> None:
        if not self.is_running:  # a worker's message arriving while the app shuts down
            return
        self.main.progress.advance(message.stage, message.done, message.total)

    def on_fit_done(self, message: FitDone) -> None:
        if not self.is_running:  # a worker's message arriving while the app shuts down
            return
        self.fit_running = False
        self.main.progress.stop()
        if message.error is not None:
            self._fit_failed.add(message.user)
            self.notify(f"Fitting {message.user} failed: {message.error}", severity="error", timeout=15)
        elif message.report is not None:
            self._fit_failed.discard(message.user)
            self.notify(f"{message.user}: {fit_summary(message.report.to_json())}", title="Profile updated")
        if self.user is not None and self.user.name == message.user:
            self.refresh_user_views()
            self.regenerate()
        if self._refit_again:
            self._refit_again = False
            self.start_refit()
        elif message.error is None:
            self.maybe_refit()

    # ------------------------------------------------------------------ demo user
    def on_demo_ready(self, message: DemoReady) -> None:
        if not self.is_running:  # a worker's message arriving while the app shuts down
            return
        self.fit_running = False
        self.main.progress.stop()
        if message.user is None:
            self.notify(f"The demo user could not be prepared: {message.error}", severity="error", timeout=30)
            self.push_screen(WelcomeScreen(), self._after_welcome)
            return
        if not self.draft_text.strip():
            article = first_demo_article()
            if article:
                self.main.draft.text = article
        self.select_user(message.user)

    # ------------------------------------------------------------------ navigation
    def action_focus_draft(self) -> None:
        self.main.draft.focus()

    def action_show_tab(self, tab: str) -> None:
        self.main.tabs.active = tab
        pane = self.main.tabs.get_pane(tab)
        focusable = [widget for widget in pane.query("*") if widget.focusable]
        if focusable:
            focusable[0].focus()

    # ------------------------------------------------------------------ shutdown
    def close_service(self, timeout: float = 60.0) -> None:
        """After the app has exited: wait for the engine to be free, then close it."""
        self.workers.cancel_all()
        if self.engine_lock.acquire(timeout=timeout):
            try:
                self.service.close()
            finally:
                self.engine_lock.release()


def fit_summary(report: dict[str, object]) -> str:
    """One line about a fit report, e.g. 'cluster 1, own vector from 24 pairs (held-out accuracy 0.80)'."""
    mode = report.get("mode")
    if mode == "cold-start":
        return "no history yet, so outputs use the global adapter"
    line = f"cluster {report.get('cluster')}, "
    if mode == "too-few-pairs":
        return line + f"no own vector yet (only {report.get('n_pairs')} usable pairs)"
    line += f"own vector from {report.get('n_pairs')} pairs"
    heldout = report.get("heldout_accuracy")
    if isinstance(heldout, float):
        line += f" (held-out pair accuracy {heldout:.2f})"
    return line


def first_demo_article() -> str | None:
    """The first shipped demo article's input, or None when the demo files are not installed."""
    try:
        from localpers.device.demo import demo_articles

        articles = demo_articles()
    except (LocalpersError, OSError, ValueError, KeyError):
        return None
    return articles[0] if articles else None


def run_app(service: WritingService, *, user: str | None = None, text: str = "") -> None:
    """Run the TUI until the user quits, then close the engine once no worker uses it."""
    app = LocalpersApp(service, user=user, text=text)
    try:
        app.run()
    finally:
        app.close_service()
