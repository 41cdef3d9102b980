"""The app's first run and its imports: the welcome screen's choice (the demo user, a history file, or quit), the
demo user made ready in the background, and a history imported through the dialog made the session's user.

`FirstRunMixin` is a base of `localpers.tui.app.LocalpersApp` and uses the app's state named below; it draws no
widget of its own (the welcome and import dialogs are `localpers.tui.screens`').
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from localpers.errors import LocalpersError
from localpers.tasks import get_task
from localpers.tui import engine_jobs
from localpers.tui.messages import DemoReady
from localpers.tui.screens.import_history import ImportScreen
from localpers.tui.screens.welcome import WelcomeScreen
from localpers.tui.userdata import ImportSummary
from localpers.users.store import User, UserStore

if TYPE_CHECKING:
    from localpers.tui.screens.main import MainScreen


class FirstRunMixin:
    """The welcome screen's choices, the demo user and imports, for `LocalpersApp`."""

    # The app's state this part reads and writes (set in `LocalpersApp.__init__`).
    main: MainScreen
    store: UserStore
    user: User | None
    fit_running: bool
    _refit_queue: list[User]
    # It also calls Textual's `notify`, `push_screen`, `exit` and `is_running`, and the app's `select_user`,
    # `refresh_user_views`, `start_refit`, `start_queued_refit`, `quit_asking_first`, `draft_text` and
    # `_run_engine_job`.

    def _after_welcome(self, choice: str | None) -> None:
        if choice == "demo":
            self.main.progress.start("preparing the demo user")
            self.fit_running = True
            self._run_engine_job("fit", engine_jobs.prepare_demo)
        elif choice == "import":
            self.push_screen(ImportScreen(self.store, None), self._after_import)
        else:  # a draft reopened from the last stop is in the editor only: asked first, as ctrl+q does
            self.quit_asking_first(on_stay=lambda: self.push_screen(WelcomeScreen(), self._after_welcome))

    def _after_import(self, summary: ImportSummary | None) -> None:
        if summary is None:
            # first run: back to the choice, unless the demo user is being prepared (its Escape would quit)
            if self.user is None and not self.fit_running:
                self.push_screen(WelcomeScreen(), self._after_welcome)
            return
        skipped = f", {_counted(summary.skipped, 'duplicate')} skipped" if summary.skipped else ""
        imported = f"Imported {_counted(summary.added, 'item')} into {summary.user!r} ({summary.total} in all{skipped})"
        fitting = "; fitting…" if summary.added else "; its fit stays as it was"
        if self.user is None or self.user.name != summary.user:
            try:
                self.store.use(summary.user)
            # e.g. a full disk, or the user deleted since: as the User list says
            except LocalpersError as exc:
                self.notify(f"{summary.user!r} could not be made the active user: {exc}", severity="error")
                # this session keeps its user, as the command line's does: the imported one is not fitted yet
                if self.user is not None:
                    later = f"; choose {summary.user!r} in the User list to fit it" if summary.added else ""
                    self.notify(imported + later)
                    return
            self.notify(imported + fitting)
            self.select_user(summary.user)
        else:
            self.notify(imported + fitting)
            self.refresh_user_views()
            if summary.added:
                self.start_refit()

    def on_demo_ready(self, message: DemoReady) -> None:
        if not self.is_running:  # a worker's message arriving while the app shuts down
            return
        self.fit_running = False
        self.main.progress.stop()
        if message.user is None:
            self.notify(f"The demo user could not be prepared: {message.error}", severity="error", timeout=30)
            self.push_screen(WelcomeScreen(), self._after_welcome)
            return
        if self.user is not None:  # a history imported while the demo was prepared: that user stays
            self.notify(f"The demo user is ready: pick {message.user!r} in the User list to try it.")
            self.start_queued_refit()  # that user's fit waited for the demo's
            return
        self._refit_queue.clear()
        if not self.draft_text.strip():
            article = first_demo_article()
            if article:
                self.main.draft.text = article
        self.select_user(message.user)


def _counted(count: int, noun: str) -> str:
    """ "1 item", "3 items"."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def first_demo_article() -> str | None:
    """The first shipped demo article's input, or None when the demo files are not installed."""
    try:
        from localpers.device.demo import demo_articles

        articles = demo_articles()
    except (LocalpersError, OSError, ValueError, KeyError):
        return None
    return get_task("headline").content(articles[0]) if articles else None  # the instruction is the task's
