"""The app's user and what it shows of them: choosing the user, their profile, the panels and header it fills.

`select_user` makes a user the session's, `refresh_user_views` re-reads their folder (history, fit, profile)
into the History and Profile tabs and the header, and sets α to the strength their fit chose; `switch_user` is
the User select's choice, made the active user as `localpers user use` does. Noticing another command's changes
to the user's folder is `localpers.tui.user_watch`; this module writes nothing but the active user's pointer.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from localpers.errors import LocalpersError
from localpers.tui.userdata import Profile, load_profile
from localpers.tui.widgets.stepper import Stepper
from localpers.users.history import HistoryItem
from localpers.users.store import User, UserStore

if TYPE_CHECKING:
    from localpers.tui.screens.main import MainScreen
    from localpers.tui.service import EngineInfo


class UserViewsMixin:
    """The session's user and the views of them (see the module docstring)."""

    main: MainScreen
    store: UserStore
    info: EngineInfo | None
    user: User | None
    profile: Profile | None
    sub_title: str
    _fit_failed: dict[str, str]
    _rejected_told: dict[str, str | None]  # user -> the damaged rejected-outputs file's problem last told
    _strength_source: tuple[str, float | None] | None  # whose chosen α the stepper shows
    # It also calls Textual's `notify` and the app's `show_user_names`, `remember_user_stamp`, `maybe_refit` and
    # `regenerate`.

    def select_user(self, name: str) -> None:
        """Make `name` the user of this session: profile, panels, refit if due, personalized output."""
        try:
            user = self.store.get(name)
        except LocalpersError as exc:
            self.notify(str(exc), severity="error", timeout=10)
            return
        self.user = user
        self.show_user_names(self.store.list())
        self.refresh_user_views()
        self.maybe_refit()
        self.regenerate()

    def refresh_user_views(self, history: list[HistoryItem] | None = None) -> None:
        """Re-read the user's folder into the profile, history and profile panels and the header; `history`
        is the history just saved by the caller (an accept, a remove), which is then not read and parsed again."""
        self.remember_user_stamp()  # before reading: a change made while the files are read shows at the next watch
        if self.user is None:
            self.profile = None
            self.main.history_panel.show(None, [])
            self.main.profile_panel.profile = None
            self.sub_title = "no user"
            return
        items: list[HistoryItem] = []
        try:
            items = self.user.history() if history is None else history
            info = self.info
            self.profile = load_profile(
                self.user,
                info.bundle_sha256 if info else None,
                info.clusters if info else None,
                info.head_d if info else None,
                history=items,
            )
        except LocalpersError as exc:
            self.notify(str(exc), severity="error", timeout=10)
            self.profile = Profile(self.user.name, len(items), problem=str(exc))
        rejected_problem = self.profile.rejected_problem
        if rejected_problem is not None and self._rejected_told.get(self.user.name) != rejected_problem:
            # once per problem: every refresh (each accept, each watch tick after a change) told it again
            self.notify(rejected_problem, severity="error", timeout=10)
        self._rejected_told[self.user.name] = rejected_problem
        failed = self._fit_failed.get(self.user.name)
        if failed is not None:  # kept in view, not only in the notice that reported it
            self.profile = dataclasses.replace(self.profile, fit_error=failed)
        self.main.history_panel.show(self.user.name, items)
        self.main.profile_panel.profile = self.profile
        self.sub_title = self._header_line()
        self._start_strength()

    def _start_strength(self) -> None:
        """Set α to the strength the user's fit chose (what `localpers rewrite` uses), else the bundle's
        default; once per user and choice, so the user's own α stays until either changes."""
        if self.info is None or self.profile is None:
            return
        source = (self.profile.user, self.profile.vector_strength)
        if source == self._strength_source:
            return
        self._strength_source = source
        chosen = self.profile.vector_strength
        strength = self.main.controls.strength
        with strength.prevent(Stepper.Changed):
            strength.set_value(self.info.default_strength if chosen is None else chosen)

    def _header_line(self) -> str:
        profile = self.profile
        if profile is None:
            return "no user"
        if profile.problem is not None:  # not "0 examples · cold start": the Profile tab says what is wrong
            return f"user {profile.user} · a file of this user cannot be read (Profile tab, F4)"
        parts = [f"user {profile.user}", f"{profile.n_history} examples"]
        if profile.can_personalize:
            parts.append(f"cluster {profile.cluster}")
        elif profile.n_history == 0:
            parts.append("cold start")
        if self.info is None:
            parts.append("loading the model…")
        return " · ".join(parts)

    def switch_user(self, name: object) -> None:
        """The User select's choice: make `name` the active user and the session's (a refused switch, or
        "(no user)" picked while a user is open, puts the select back on the session's user)."""
        if not isinstance(name, str):
            self._show_current_user()
            return
        if self.user is None or name != self.user.name:
            try:
                self.store.use(name)
            except LocalpersError as exc:
                self.notify(str(exc), severity="error")
                self._show_current_user()
                return
            self.select_user(name)

    def _show_current_user(self) -> None:
        """Put the User select back on the user of this session (after a refused switch)."""
        if self.user is None:
            return
        try:
            names = self.store.list()
        except LocalpersError:
            names = [self.user.name]
        self.show_user_names(names)
