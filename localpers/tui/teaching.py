"""The app's teaching half: accept, edit, reject and remove outputs, import a history, and refit after.

Accepting (or editing and accepting) adds `(draft, output)` to the user's history, rejecting keeps the
output in the user's `negatives_user.jsonl` (`localpers.tui.userdata` does the writing); a refit then runs
in the background (`engine_jobs.fit`, under the app's engine lock) with a progress bar, and the profile,
header and personalized output update when it ends. `TeachingMixin` is a base of
`localpers.tui.app.LocalpersApp` and uses the app's state named below; it draws no widget of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.timer import Timer

from localpers.errors import LocalpersError
from localpers.methods.reports import RewriteResult
from localpers.tui import engine_jobs
from localpers.tui.messages import FitDone, FitProgressed
from localpers.tui.screens.confirm import ConfirmScreen
from localpers.tui.screens.edit_accept import EditAcceptScreen
from localpers.tui.screens.import_history import ImportScreen
from localpers.tui.service import EngineInfo
from localpers.tui.text import flatten_whitespace, shorten
from localpers.tui.userdata import Profile, accept_output, reject_output, remove_history_item
from localpers.tui.widgets.history_panel import HistoryPanel
from localpers.users.lock import read_identity
from localpers.users.store import User, UserStore

if TYPE_CHECKING:
    from localpers.tui.screens.main import MainScreen

BUSY_RETRY_SECONDS = 10.0


class TeachingMixin:
    """Accept, reject, remove, import and refit, for `LocalpersApp` (whose state and Textual calls it uses)."""

    # The app's state this half reads and writes (set in `LocalpersApp.__init__`).
    main: MainScreen
    store: UserStore
    info: EngineInfo | None
    load_error: str | None
    user: User | None
    profile: Profile | None
    personal_result: RewriteResult | None
    personal_input: str | None
    fit_running: bool
    refit_delay: float
    _refit_timer: Timer | None
    _refit_timer_user: User | None  # whom the pending timer refits
    _refit_queue: list[User]  # fits asked for while another fit ran or the model loaded, in order
    _fit_failed: dict[str, str]  # user -> why their last fit failed (no automatic refit until ctrl+f)
    busy_retry_delay: float = BUSY_RETRY_SECONDS  # a fit refused because another command held the user
    _busy_noticed: set[str]  # users whose busy refusal was told, until a fit of theirs ends otherwise
    # It also calls Textual's `notify`, `push_screen`, `set_timer` and the app's `refresh_user_views`,
    # `regenerate`, `_run_engine_job` and `_after_import`.

    def _finished_output(self) -> RewriteResult | None:
        """The personalized output for the current draft, or None (with a notice saying why)."""
        if self.user is None:
            self.notify("Choose or create a user first (ctrl+o imports a history file).", severity="warning")
            return None
        result = self.personal_result
        if result is None or self.personal_input != self.draft_text or not result.text.strip():
            panel = self.main.personal_panel
            if panel.has_class("failed"):  # say why there is none (its reason, whole)
                self.notify(f"No output to keep: {panel.placeholder}", severity="warning", timeout=10)
                return None
            self.notify(
                "No finished output for this draft yet: wait for it or press ctrl+r.", severity="warning"
            )
            return None
        return result

    def action_accept(self) -> None:
        result = self._finished_output()
        if result is None or self.personal_input is None:
            return
        problem = self.accept_text(result.task, self.personal_input, result.text)
        if problem is not None:
            self.notify(problem, severity="error", timeout=10)

    def action_edit_accept(self) -> None:
        result = self._finished_output()
        if result is None or self.personal_input is None:
            return
        task, input_text = result.task, self.personal_input

        def accept(edited: str) -> str | None:
            return self.accept_text(task, input_text, edited)

        # The dialog accepts itself and stays open with the edit and the reason when that is refused.
        self.push_screen(EditAcceptScreen(result.text, accept))

    def accept_text(self, task: str, input_text: str, accepted: str) -> str | None:
        """Add (input_text, accepted) to the user's history and refit in the background; the one-line
        reason when it is refused (nothing written)."""
        if self.user is None:
            return "Choose or create a user first (ctrl+o imports a history file)."
        try:
            outcome = accept_output(self.user, task, input_text, accepted)
        except LocalpersError as exc:
            return str(exc)
        if not outcome.added:
            self.notify(f"Already in {self.user.name}'s history as {outcome.item.id}; nothing added.")
            return None
        self.refresh_user_views(history=outcome.history)
        count = self.profile.n_history if self.profile else 0
        self.notify(f"Added to {self.user.name}'s history ({count} examples); refitting in the background.")
        self.schedule_refit()
        return None

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
            self.notify(
                f"Kept as a rejected output in {self.user.name}'s folder for a later fit (none reads them yet);"
                " not added to the history."
            )
        else:
            self.notify("This output was already rejected.")

    def on_history_panel_remove_requested(self, message: HistoryPanel.RemoveRequested) -> None:
        item_id = message.item_id

        def remove(confirmed: bool | None) -> None:
            if not confirmed or self.user is None:
                return
            try:
                outcome = remove_history_item(self.user, item_id)
            except LocalpersError as exc:
                self.notify(str(exc), severity="error")
                return
            self.refresh_user_views(history=outcome.history)
            self.notify(
                f"Removed {outcome.item.id} from {self.user.name}'s history; refitting in the background."
            )
            self.schedule_refit()

        shown = next((item for item in self.main.history_panel.items if item.id == item_id), None)
        what = (
            f"{item_id} ({flatten_whitespace(shorten(shown.output, 80))!r})" if shown is not None else item_id
        )
        self.push_screen(ConfirmScreen(f"Remove history item {what} and refit?"), remove)

    def action_import_history(self) -> None:
        self.push_screen(ImportScreen(self.store, self.user.name if self.user else None), self._after_import)

    # ------------------------------------------------------------------ fitting
    def maybe_refit(self) -> None:
        """Refit when the profile is due (no fit, another bundle, history changed, or a damaged state or vector
        that a fit replaces) and it has not failed."""
        profile = self.profile
        if (
            self.info is not None
            and profile is not None
            # a user without items keeps the fit it came with: a fit would not replace its damaged state
            and (
                (profile.bundle_matches is not None and profile.needs_fit)
                or (profile.refit_mends and profile.n_history)
            )
            and profile.user not in self._fit_failed
        ):
            self.start_refit()

    def _refit_if_due(self, user_name: str) -> None:
        """After another command held `user_name`: read what it stored, then fit if the profile is still due."""
        self._refit_timer = None
        if self.user is not None and self.user.name == user_name and not self.fit_running:
            self.refresh_user_views()
            self.maybe_refit()

    def schedule_refit(self) -> None:
        """Refit the current user after `refit_delay` seconds, so several accepts or removals share one fit.

        The fit is of the user whose history changed, even if another is shown when the timer fires; a pending
        refit of another user (one switched away from within the delay) starts now instead of being dropped.
        """
        user = self.user
        pending = self._refit_timer_user
        self._stop_refit_timer()
        if pending is not None and (user is None or not _same_user(pending, user)):
            self.start_refit(pending)
        if user is not None:
            self._refit_timer_user = user
            self._refit_timer = self.set_timer(self.refit_delay, lambda: self.start_refit(user))

    def _stop_refit_timer(self) -> None:
        if self._refit_timer is not None:
            self._refit_timer.stop()
        self._refit_timer = None
        self._refit_timer_user = None

    def action_refit(self) -> None:
        if self.user is not None:
            self._fit_failed.pop(self.user.name, None)
        self.start_refit()

    def start_refit(self, user: User | None = None) -> None:
        """Fit `user` (the current one by default) now, or once the running fit or the model's loading ends."""
        target = user if user is not None else self.user
        if self._refit_timer_user is None or target is None or _same_user(self._refit_timer_user, target):
            self._stop_refit_timer()  # this fit is the one the timer would start
        if target is None:
            self.notify("No user to fit yet.", severity="warning")
            return
        if self.info is None:
            message = self.load_error or "The model is still loading; the fit starts when it is ready."
            self.notify(message, severity="error" if self.load_error else "information")
            if self.load_error is None:  # started by on_engine_loaded
                self._queue_refit(target)
            return
        if self.fit_running:
            self._queue_refit(target)
            return
        self.fit_running = True
        self.main.progress.start(f"fitting {target.name}")
        self._run_engine_job("fit", engine_jobs.fit, target)

    def _queue_refit(self, user: User) -> None:
        if not any(_same_user(queued, user) for queued in self._refit_queue):
            self._refit_queue.append(user)

    def start_queued_refit(self) -> bool:
        """Start the first fit asked for while another fit ran or the model loaded whose user still exists (one
        deleted or made anew since is dropped); False if none was started."""
        if self.fit_running:
            return False
        while self._refit_queue:
            user = self._refit_queue.pop(0)
            if user.dir.is_dir() and not user.made_anew():
                self.start_refit(user)
                return True
        return False

    def on_fit_progressed(self, message: FitProgressed) -> None:
        if not self.is_running:  # a worker's message arriving while the app shuts down
            return
        self.main.progress.advance(message.stage, message.done, message.total)

    def on_fit_done(self, message: FitDone) -> None:
        if not self.is_running:  # a worker's message arriving while the app shuts down
            return
        self.fit_running = False
        self.main.progress.stop()
        # a fit of a user deleted (and perhaps made anew) meanwhile says nothing of a user of that name now
        replaced = self._folder_replaced(message.user, message.identity)
        if message.busy:
            # a fit in a shell (or the API's user being written): not a failure, the same fit can follow it
            # told once while that command holds the user, not at every retry
            if message.user not in self._busy_noticed:
                self._busy_noticed.add(message.user)
                self.notify(
                    f"{message.user} is being fitted or changed by another localpers command; fitting again once"
                    f" it has finished, if a fit is still due (checked every {self.busy_retry_delay:.0f} s).",
                    timeout=10,
                )
            pending = self._refit_timer_user
            self._stop_refit_timer()
            if pending is not None and pending.name != message.user:
                self._queue_refit(pending)  # another user's promised refit, started below
            self._refit_timer = self.set_timer(
                self.busy_retry_delay, lambda: self._refit_if_due(message.user)
            )
        elif message.error is not None and not replaced:
            self._fit_failed[message.user] = message.error
            self.notify(f"Fitting {message.user} failed: {message.error}", severity="error", timeout=15)
        elif message.report is not None:
            self._fit_failed.pop(message.user, None)
        if not message.busy:
            self._busy_noticed.discard(message.user)
        if message.report is not None and not replaced and message.kept:
            self.notify(
                f"{message.user} was imported without its history, so there is nothing to fit: it keeps the fit it"
                f" came with ({fit_summary(message.report.to_json())}). Import your items (ctrl+o) and they are"
                " fitted here.",
                title="Fit kept",
                timeout=12,
            )
        elif message.report is not None and not replaced:
            self.notify(f"{message.user}: {fit_summary(message.report.to_json())}", title="Profile updated")
        if self.user is not None and self.user.name == message.user:
            self.refresh_user_views()
            self.regenerate()
        if not self.start_queued_refit() and (message.error is None or replaced):
            self.maybe_refit()

    def _folder_replaced(self, name: str, identity: str | None) -> bool:
        """Whether the user folder a fit was made for is gone, or holds another identity token (made anew)."""
        folder = self.store.users_dir / name
        if not folder.is_dir():
            return True
        return identity is not None and read_identity(folder) != identity


def fit_summary(report: dict[str, object]) -> str:
    """One line about a fit report, e.g. 'cluster 1, own vector from 24 pairs (held-out accuracy 0.80)'."""
    mode = report.get("mode")
    if mode == "cold-start":
        return "no history yet, so outputs use the global adapter"
    line = f"cluster {report.get('cluster')}, "
    if mode == "too-few-pairs":
        pairs = report.get("n_pairs")
        return line + f"no own vector yet (only {pairs} usable pair{'' if pairs == 1 else 's'})"
    line += f"own vector from {report.get('n_pairs')} pairs"
    heldout = report.get("heldout_accuracy")
    if isinstance(heldout, float):
        line += f" (held-out pair accuracy {heldout:.2f})"
    return line


def _same_user(first: User, second: User) -> bool:
    """One user folder: the same name and identity token (a user deleted and made anew is another)."""
    return first.name == second.name and first.identity == second.identity
