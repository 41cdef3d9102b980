"""The app's watch on its user's folder: what another localpers command changed there is shown, not left stale.

A history imported, added or removed in a shell, a fit made there, the user deleted or deleted and made anew
(`user import --as` the same name): the TUI read the user once and kept showing, and correcting with, what it
had read. Every `USER_WATCH_SECONDS` the mixin compares a few `stat()` results of the user's files with those
taken when the views were last refreshed, and the folder's identity token with the user object's; on a change it
refreshes them (and refits when the history changed). The User select offers the users listed anew when another
command made or deleted one. It reads no other file's content (`refresh_user_views` does) and writes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from localpers.errors import LocalpersError
from localpers.users.lock import IDENTITY_FILE
from localpers.users.store import User, UserStore

if TYPE_CHECKING:
    from localpers.tui.screens.main import MainScreen

USER_WATCH_SECONDS = 2.0

FileStamp = tuple[int, int, int] | None
FolderStamp = tuple[FileStamp, FileStamp, FileStamp] | None
ListingStamp = frozenset[str] | None


def folder_stamp(user: User) -> FolderStamp:
    """What changes when another command writes `user`'s history, fit or identity; None when the folder is gone."""
    if not user.dir.is_dir():
        return None

    def stamp(name: str) -> FileStamp:
        try:
            info = (user.dir / name).stat()
        except OSError:
            return None
        return (info.st_ino, info.st_size, info.st_mtime_ns)

    return (stamp(user.history_path.name), stamp(user.state_path.name), stamp(IDENTITY_FILE))


class UserWatchMixin:
    """Notices another command's changes to the app's user (see the module docstring)."""

    main: MainScreen
    store: UserStore
    user: User | None
    fit_running: bool
    user_watch_seconds: float = USER_WATCH_SECONDS
    _user_stamp: FolderStamp = None
    _listed_names: list[str] | None = None  # what the User select offers
    _listing: ListingStamp = None  # the users folder's entries when they were last listed
    _fit_failed: dict[str, str]
    _strength_source: tuple[str, float | None] | None
    # It also calls Textual's `notify` and `screen`, and the app's `refresh_user_views`, `maybe_refit` and
    # `regenerate`.

    def remember_user_stamp(self) -> None:
        """Take the stamp the next watch compares with (called as the views are read)."""
        self._user_stamp = folder_stamp(self.user) if self.user is not None else None

    def watch_user_files(self) -> None:
        """Refresh the views when another command changed the user's files since they were read.

        A delete or a re-creation is judged against the user object itself (its folder, its identity token), even
        while the app's own fit runs: that fit's end refreshes the views, which would take the new folder as the
        one read. Other changes wait for the app's own fit and dialogs (an import writes, then closes its dialog).
        Nothing while the app closes: a tick then found no screen and ended the app in a traceback.
        """
        if not self.is_running:  # type: ignore[attr-defined]
            return
        user = self.user
        # a user made or deleted elsewhere (not only by the app): list them again; a listing that failed is retried
        listing = _listing_stamp(self.store.users_dir)
        # not while the User list is open: new options moved its highlight back to the session's user, so Enter
        # picked that one again (a later tick offers them, once it is closed)
        choosing = self.main.controls.user_select.expanded
        if listing != self._listing and not choosing and (names := self._listed_users()) is not None:
            self._listing = listing
            if names != self._listed_names:
                self.show_user_names(names)
        if user is None:
            return
        name = user.name
        if not user.dir.is_dir():
            self.notify(  # type: ignore[attr-defined]
                f"User {name!r} was deleted by another localpers command.", severity="warning", timeout=15
            )
            self.user = None
            self._fit_failed.pop(name, None)  # a user made later under this name is another
            self.show_user_names(self._user_names())
            self._after_external_change(history_changed=False)
            return
        if user.made_anew():
            # deleted and made anew under the same name: every write through the old object would be refused as
            # made for a user that no longer exists
            try:
                self.user = self.store.get(name)
            except LocalpersError:
                return  # gone again meanwhile: the next watch sees it
            self._fit_failed.pop(name, None)  # the old user's failed fit says nothing of the new one
            self._strength_source = None
            self.notify(  # type: ignore[attr-defined]
                f"User {name!r} was deleted and made anew by another localpers command; showing the new one.",
                severity="warning",
                timeout=15,
            )
            self._after_external_change(history_changed=True)
            return
        if self.fit_running or self.screen is not self.main:  # type: ignore[attr-defined]
            return
        before, stamp = self._user_stamp, folder_stamp(user)
        if stamp == before:
            return
        # a fit made elsewhere (perhaps with another bundle) is shown, not fitted over; a changed history refits
        self._after_external_change(history_changed=before is None or stamp is None or stamp[0] != before[0])

    def _after_external_change(self, *, history_changed: bool) -> None:
        self.refresh_user_views()  # type: ignore[attr-defined]
        if history_changed:
            self.maybe_refit()  # type: ignore[attr-defined]
        self.regenerate()  # type: ignore[attr-defined]

    def show_user_names(self, names: list[str]) -> None:
        """Offer `names` in the User select, showing the app's user; the watch offers them anew when they change."""
        self._listed_names = names
        self.main.controls.set_users(names, self.user.name if self.user is not None else None)

    def _user_names(self) -> list[str]:
        names = self._listed_users()
        return [] if names is None else names

    def _listed_users(self) -> list[str] | None:
        """The users, or None when their folder cannot be listed (it will be tried again)."""
        try:
            return self.store.list()
        except (LocalpersError, OSError):
            return None


def _listing_stamp(folder: Path) -> ListingStamp:
    """What changes when a user is made or deleted in `folder`: its entries' names (one listing, no stat of each).

    Not the folder's modification time: on a file system with coarse timestamps a user made in the same tick as
    the last listing left it unchanged, and the user was never offered."""
    try:
        return frozenset(os.listdir(folder))
    except OSError:
        return None
