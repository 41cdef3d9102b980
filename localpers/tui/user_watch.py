"""The app's watch on its user's folder: what another localpers command changed there is shown, not left stale.

A history imported, added or removed in a shell, a fit made there, the user deleted or deleted and made anew
(`user import --as` the same name): the TUI read the user once and kept showing, and correcting with, what it
had read. Every `USER_WATCH_SECONDS` the mixin compares a few `stat()` results of the user's files with those
taken when the views were last refreshed; on a change it refreshes them (and refits when that is now due). It
reads no file's content itself (`refresh_user_views` does) and writes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from localpers.errors import LocalpersError
from localpers.users.lock import IDENTITY_FILE
from localpers.users.store import User, UserStore

if TYPE_CHECKING:
    from localpers.tui.screens.main import MainScreen

USER_WATCH_SECONDS = 2.0

FileStamp = tuple[int, int, int] | None
FolderStamp = tuple[FileStamp, FileStamp, FileStamp] | None


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
    # It also calls Textual's `notify` and the app's `refresh_user_views`, `maybe_refit` and `regenerate`.

    def remember_user_stamp(self) -> None:
        """Take the stamp the next watch compares with (called as the views are read)."""
        self._user_stamp = folder_stamp(self.user) if self.user is not None else None

    def watch_user_files(self) -> None:
        """Refresh the views when another command changed the user's files since they were read."""
        if self.user is None or self.fit_running:  # the app's own fit writes; it refreshes when done
            return
        stamp = folder_stamp(self.user)
        if stamp == self._user_stamp:
            return
        name, before = self.user.name, self._user_stamp
        if stamp is None:
            self.notify(  # type: ignore[attr-defined]
                f"User {name!r} was deleted by another localpers command.", severity="warning", timeout=15
            )
            self.user = None
            self.main.controls.set_users(self._user_names(), None)
        elif before is not None and before[2] is not None and stamp[2] != before[2]:
            # deleted and made anew under the same name: the user object's identity is the old folder's, and every
            # write through it would be refused as made for a user that no longer exists
            try:
                self.user = self.store.get(name)
            except LocalpersError:
                return  # gone again meanwhile: the next watch sees it
            self.notify(  # type: ignore[attr-defined]
                f"User {name!r} was deleted and made anew by another localpers command; showing the new one.",
                severity="warning",
                timeout=15,
            )
        self.refresh_user_views()  # type: ignore[attr-defined]
        self.maybe_refit()  # type: ignore[attr-defined]
        self.regenerate()  # type: ignore[attr-defined]

    def _user_names(self) -> list[str]:
        try:
            return self.store.list()
        except LocalpersError:
            return []
