"""The app's generating half: both outputs for the current draft, from the cache or a generation job.

`regenerate` asks `localpers.tui.runs` for the personalized panel's request (`personal_request`, which asks
the method registry) and the baseline's, serves what the cache holds, and starts one engine job
(`engine_jobs.generate`, exclusive: a newer one cancels the older) for the rest; the `Generation*`
messages then stream into the panels, each tagged with its job id so a superseded job's pieces are
dropped. `GenerationMixin` is a base of `localpers.tui.app.LocalpersApp` and uses the app's state named
below; it owns no widget.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.timer import Timer

from localpers.errors import LocalpersError
from localpers.methods.base import cut_text_note
from localpers.methods.registry import BASELINE_METHOD
from localpers.methods.reports import RewriteResult
from localpers.tasks import get_task
from localpers.tui import engine_jobs
from localpers.tui.job_threads import JobThreads
from localpers.tui.messages import GenerationDone, GenerationFailed, GenerationPiece, GenerationStarted
from localpers.tui.runs import ResultCache, personal_request, plan_runs, result_status
from localpers.tui.service import EngineInfo, RewriteRequest
from localpers.tui.userdata import Profile
from localpers.users.store import User

if TYPE_CHECKING:
    from localpers.tui.screens.main import MainScreen

EMPTY_DRAFT_HINT = "The output appears here as you write."


class GenerationMixin:
    """Schedule, plan and show generations, for `LocalpersApp` (whose state and Textual calls it uses)."""

    # The app's state this half reads and writes (set in `LocalpersApp.__init__`).
    main: MainScreen
    info: EngineInfo | None
    load_error: str | None
    user: User | None
    profile: Profile | None
    personal_result: RewriteResult | None
    personal_input: str | None
    fit_running: bool
    debounce: float
    job_id: int
    _cache: ResultCache
    _debounce_timer: Timer | None
    _cut_noted_job: int  # the last job whose cut text was noted
    # panel -> the error it failed with and was told, until it generates again
    _failures_shown: dict[str, str]
    engine_jobs: JobThreads
    # It also calls Textual's `set_timer`, `notify` and `is_running` and the app's `draft_text` and
    # `_run_engine_job`.

    def schedule_generation(self) -> None:
        """Regenerate once the user has paused for `debounce` seconds."""
        if self._debounce_timer is not None:
            self._debounce_timer.stop()
        self._debounce_timer = self.set_timer(self.debounce, self.regenerate)

    def action_regenerate(self) -> None:
        self.regenerate(force=True)

    def regenerate(self, force: bool = False) -> None:
        """Show both outputs for the current draft: from the cache, or by starting a generation job."""
        if self._debounce_timer is not None:
            self._debounce_timer.stop()
            self._debounce_timer = None
        main = self.main
        text = self.draft_text
        self.job_id += 1
        task = main.controls.task
        controls, profile = main.controls, self.profile
        history_problem = personal = None
        try:
            history = self.user.history_index(get_task(task)) if self.user is not None else None
        except LocalpersError as exc:
            history_problem = str(exc)
            main.personal_panel.border_title = "Personalized · the history cannot be read"
        else:
            personal, title = personal_request(
                text,
                task,
                controls.method,
                profile,
                history=history,
                strength=controls.strength.value,
                top_k=int(controls.top_k.value),
            )
            # before an empty draft returns: the title said what an earlier user, method or α would have made
            main.personal_panel.border_title = title
        if not text.strip():
            self.engine_jobs.cancel_group("generate")
            main.baseline_panel.clear(EMPTY_DRAFT_HINT)
            main.personal_panel.clear(EMPTY_DRAFT_HINT)
            self._set_personal(None, None)
            return
        baseline = RewriteRequest(text, task, BASELINE_METHOD)
        requests = [("baseline", baseline)]
        if personal is None:
            # A damaged history: the personal panel says so (refresh_user_views notified once) and the
            # baseline still generates; the app keeps running.
            main.personal_panel.fail(history_problem or "")
            self._set_personal(None, None)
        else:
            requests.insert(0, ("personal", personal))
        cached, runs = plan_runs(requests, self._cache, force=force)
        for target, result in cached.items():
            main.panel(target).finish(result.text, result_status(result, cached=True))
            if target == "personal":
                self._set_personal(result, text)
        if not runs:
            self.engine_jobs.cancel_group("generate")
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
            self._failures_shown.pop(target, None)
        if "personal" in message.targets:
            self._set_personal(message.result, message.request.text)
        self._note_cut_text(message)

    def _note_cut_text(self, message: GenerationDone) -> None:
        """Say once per job, as `localpers rewrite` does, when the model read only the text's start."""
        note = cut_text_note(message.request.text, message.result)
        if note is not None and self._cut_noted_job != message.job:
            self._cut_noted_job = message.job
            self.notify(f"note: {note}", timeout=10)

    def on_generation_failed(self, message: GenerationFailed) -> None:
        if not self.is_running:  # a worker's message arriving while the app shuts down
            return
        if message.job == self.job_id:
            for target in message.targets:
                self.main.panel(target).fail(message.error)
            # whole, as `localpers rewrite` prints it (a panel's border cuts it): once while a panel keeps failing
            # so (each pause in typing regenerates), and once when both outputs fail alike
            told = message.error in self._failures_shown.values()
            self._failures_shown.update(dict.fromkeys(message.targets, message.error))
            if not told:
                self.notify(message.error, title="Not generated", severity="error", timeout=15)

    def _set_personal(self, result: RewriteResult | None, input_text: str | None) -> None:
        self.personal_result = result
        self.personal_input = input_text
        self.main.why.show(result)
