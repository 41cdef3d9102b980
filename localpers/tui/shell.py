"""The app's shell: how `LocalpersApp` meets its user and the system, apart from writing and teaching.

The theme chosen last time (`localpers.tui.settings`), the key list (F10 shows and hides it, Escape closes it),
notices (at least `NOTICE_SECONDS` on screen, an error or warning titled in words, never markup), quitting (with
a draft written or an output being edited it asks first), SIGTERM and SIGHUP (they close the app as ctrl+q does,
the terminal restored, and keep the draft for the next start), and Textual's crash report without the frames'
local variables. `ShellMixin` is a base of
`localpers.tui.app.LocalpersApp`, before Textual's `App`, whose methods it extends; it draws no widget of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

from textual.notifications import SeverityLevel
from textual.theme import Theme

from localpers import interrupts
from localpers.tui.crash_report import tracebacks_without_locals
from localpers.tui.kept_draft import keep_draft, kept_draft_path, kept_draft_waits, take_kept_draft
from localpers.tui.screens.confirm import ConfirmScreen
from localpers.tui.screens.edit_accept import EditAcceptScreen
from localpers.tui.settings import load_settings, save_theme

if TYPE_CHECKING:
    from localpers.tui.screens.main import MainScreen

QUIT_QUESTION = "Quit localpers? The draft is not kept (your history and accepted outputs are)."
QUIT_EDIT_QUESTION = (
    "Quit localpers? Your edit of the output is not accepted or kept, nor the draft (your history and accepted"
    " outputs are)."
)
NOTICE_SECONDS = 10.0  # the shortest a notice stays: long enough to read, also with a magnifier


class ShellMixin:
    """Notices, quitting, stop signals and crash reports, for `LocalpersApp` (whose Textual calls it uses)."""

    main: MainScreen
    stopped_by_signal: int | None  # the signal that closed the app (None: the user quit); set in __init__
    draft_kept: bool  # whether that signal's stop kept the draft (`keep_draft`); set in __init__
    draft_keep_problem: str | None  # why it could not; set in __init__
    _saved_theme: str | None  # the theme `tui.json` holds (`localpers.tui.settings`); set in __init__
    # It also calls Textual's `exit`, `screen`, `push_screen`, `theme`, `available_themes`, `theme_changed_signal`
    # and the key list's actions, and extends `notify` and `_fatal_error`.

    def _restore_theme(self) -> None:
        """Start with the theme chosen last time (ctrl+p, "Theme"), and remember each new choice."""
        saved = load_settings()
        if saved.problem:
            self.notify(saved.problem, severity="warning")
        if saved.theme is not None and saved.theme in self.available_themes:
            self.theme = saved.theme
        elif saved.theme is not None:
            self.notify(
                f"the saved theme {saved.theme!r} is not available here; using {self.theme!r}",
                severity="warning",
            )
        self._saved_theme = saved.theme
        self.theme_changed_signal.subscribe(self, self._remember_theme)

    def _remember_theme(self, theme: Theme) -> None:
        if theme.name == self._saved_theme:
            return
        problem = save_theme(theme.name)
        if problem:
            self.notify(problem, severity="warning")
        else:
            self._saved_theme = theme.name

    def _help_panel_shown(self) -> bool:
        return bool(self.screen.query("HelpPanel"))

    def action_toggle_help_panel(self) -> None:
        if self._help_panel_shown():
            self.action_hide_help_panel()
        else:
            self.action_show_help_panel()

    def _fatal_error(self) -> None:
        """Textual's crash report, without each frame's local variables: they hold the draft and the history's
        text, which the report prints to the terminal and a user may paste into a bug report."""
        with tracebacks_without_locals():
            super()._fatal_error()  # type: ignore[misc]

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
    ) -> None:
        """Textual's notice, readable by more people: at least NOTICE_SECONDS on screen, an error or warning
        titled as such (not told by its colour alone), and its text shown as it is (file names and the user's
        text are never taken as markup)."""
        if not title and severity in ("warning", "error"):
            title = severity.capitalize()
        shown = max(timeout if timeout is not None else 0.0, NOTICE_SECONDS)
        super().notify(  # type: ignore[misc]
            message, title=title, severity=severity, timeout=shown, markup=markup
        )

    def action_help_quit(self) -> None:
        """Textual's own hint for ctrl+c, without its markup: every notice here is shown as it is, and Textual's
        showed "Press [b]ctrl+q[/b]"."""
        for key, active in self.active_bindings.items():  # type: ignore[attr-defined]
            if active.binding.action in ("quit", "app.quit"):
                self.notify(f"Press {key} to quit the app", title="Do you want to quit?")
                return

    def _stop_on_signals(self) -> None:
        """Let SIGTERM and SIGHUP (`kill`, a closed terminal) close the app as ctrl+q does, the terminal
        restored and the engine closed, instead of ending the process inside the alternate screen."""
        loop = asyncio.get_running_loop()
        for signum in interrupts.stop_signals():
            if signal.getsignal(signum) is signal.SIG_IGN:  # nohup's SIGHUP stays ignored
                continue
            # Not where the platform has no such handlers (Windows) or off the main thread (some tests).
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signum, self._stop_by_signal, signum)

    async def action_quit(self) -> None:
        """Quit; with a draft written, first ask (it is not kept), and a second ctrl+q on the question quits."""
        asked = isinstance(self.screen, ConfirmScreen) and self.screen.question in (
            QUIT_QUESTION,
            QUIT_EDIT_QUESTION,
        )
        if asked:
            self.exit()
            return
        self.quit_asking_first()

    def quit_asking_first(self, on_stay: Callable[[], None] | None = None) -> None:
        """Quit at once when nothing written would be lost, else ask first (`on_stay` runs when the answer is
        no): the draft, and an Edit dialog's changed text."""
        edited = self._edit_under_way() is not None
        if not (edited or self.main.draft.text.strip()):
            self.exit()
            return

        def answered(quit_now: bool | None) -> None:
            if quit_now:
                self.exit()
            elif on_stay is not None:
                on_stay()

        self.push_screen(ConfirmScreen(QUIT_EDIT_QUESTION if edited else QUIT_QUESTION), answered)

    def _edit_under_way(self) -> str | None:
        """The text of an Edit dialog changed from the output it opened with (quitting loses it), or None."""
        for screen in self.screen_stack:  # type: ignore[attr-defined]
            if isinstance(screen, EditAcceptScreen) and screen.editor.text != screen.initial_text:
                return screen.editor.text
        return None

    def _stop_by_signal(self, signum: int) -> None:
        """Close as ctrl+q does, without asking (no one may be there to answer): the draft, and an Edit dialog's
        changed text after it, are kept for the next start (`localpers.tui.kept_draft`), which a closed terminal
        lost before."""
        self.stopped_by_signal = signum
        written = [self.main.draft.text, self._edit_under_way() or ""]
        kept = "\n\n".join(text for text in written if text.strip())
        if kept:
            self.draft_keep_problem = keep_draft(kept)
            self.draft_kept = self.draft_keep_problem is None
        self.exit()

    def _reopen_kept_draft(self) -> None:
        """Open with the draft the last stop signal kept, unless the command gave a text of its own (then say that
        one waits: a later stop adds to it)."""
        if self.main.draft.text:
            if kept_draft_waits():
                self.notify(
                    f"a draft kept when the app was last closed by a signal waits in {kept_draft_path()};"
                    " `localpers tui` without --text opens it",
                    severity="warning",
                )
            return
        text, problem = take_kept_draft()
        if problem is not None:
            self.notify(problem, severity="warning")
        if text:
            self.main.draft.text = text
            self.notify("what you were writing when the app was last closed by a signal is back in the draft")
