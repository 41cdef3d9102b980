"""The named users on this device: which exist, which one is active, creating, deleting, exporting, importing.

Layout under `paths.data_dir()` (or the `root` given to `UserStore`):

    active.json      {"user": "ann"}: the active user
    users/<name>/    one user's folder (`localpers.users.folder.User`: history, state, vector)

A user appears and disappears in one rename: `create` and `import_` build the folder in a hidden staging
folder beside the users and rename it into place, `delete` renames it away before removing the files, and
leftovers of an interrupted one are swept (`localpers.users.staging`). The archive format of `export`/`import_`
is `localpers.users.archive`, and which of a user's files go in `localpers.users.archive_members`. Nothing of a
user's text is written outside its folder (except `export`, to the destination the user names). This module does
not fit or embed anything.

`User`, `validate_name`, `history_for` and the atomic writers are re-exported here for the modules that
reach a user through the store.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from localpers import paths
from localpers.atomic import atomic_write_bytes, atomic_write_text, fsync_directory
from localpers.errors import InputError, LocalpersError, StorageError
from localpers.regular_files import read_regular_file
from localpers.untrusted import one_line, parse_json
from localpers.users import folder, staging
from localpers.users.archive import pack_archive, read_archive
from localpers.users.archive_members import fit_members, marked_for_history
from localpers.users.folder import (
    User,
    history_for,
    read_json_object,
)
from localpers.users.history import MAX_HISTORY_FILE_BYTES, MAX_HISTORY_ITEMS, check_history_size
from localpers.users.lock import IDENTITY_FILE, new_identity, read_identity, user_lock
from localpers.users.names import NAME_PATTERN, validate_name, validate_new_name

_NAMES_SHOWN = 8  # users named in the "no active user" error

__all__ = [
    "NAME_PATTERN",
    "User",
    "UserStore",
    "atomic_write_bytes",
    "atomic_write_text",
    "history_for",
    "validate_name",
]


def _creation_advice(name: str) -> str:
    """ ", `localpers user create NAME` makes one", or "" for a name `user create` refuses (a Windows device
    name)."""
    try:
        validate_new_name(name)
    except InputError:
        return ""
    return f", `localpers user create {name}` makes one"


class UserStore:
    """The users on this device and which one is active. `root` defaults to `paths.data_dir()`."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else paths.data_dir()
        self.users_dir = self.root / "users"
        self.active_path = self.root / "active.json"

    def _user(self, name: str) -> User:
        return User(name, self.users_dir / name)

    def _identified(self, user: User) -> User:
        """`user` with its folder's identity token; a folder made before tokens gets one now (under its lock;
        a read-only folder stays without, and unchecked)."""
        identity = read_identity(user.dir)
        if identity is None:
            # a lookup never waits long for this: a busy or read-only folder stays without a token this time
            who = f"user {user.name!r}"
            with contextlib.suppress(LocalpersError, OSError), user_lock(user.dir, who=who, wait_seconds=1.0):
                identity = read_identity(user.dir)
                if identity is None:
                    token = new_identity()
                    atomic_write_text(user.dir / IDENTITY_FILE, token + "\n")
                    identity = token
        return User(user.name, user.dir, identity)

    def list(self) -> list[str]:
        """User names, sorted (none while the folder is missing or not a folder: `check_folder` says which)."""
        if not self.users_dir.is_dir():
            return []
        return sorted(
            p.name for p in self.users_dir.iterdir() if p.is_dir() and NAME_PATTERN.fullmatch(p.name)
        )

    def get(self, name: str) -> User:
        self.check_folder()  # a users folder linked to an unmounted drive is not "no such user: create one"
        self._sweep()  # an interrupted delete's leftover goes at once, not at the next create
        user = self._user(validate_name(name))
        if not user.dir.is_dir():
            if os.path.lexists(user.dir):
                raise StorageError(
                    f"{staging.not_a_folder(user.dir)}; no command can use user {name!r} until then"
                )
            raise LocalpersError(
                f"no user named {name!r}; `localpers user list` shows the users{_creation_advice(name)}"
            )
        return self._identified(user)

    def create(self, name: str, *, activate: bool = True) -> User:
        """A new, empty user; with `activate`, it becomes the active user when none is active."""
        validate_new_name(name)
        self._check_free(name, "pick another name or delete it first")
        building = self._staging_dir("creating")
        try:
            try:
                User(name, building)._write_state({"created_at": folder.now()})
                atomic_write_text(building / IDENTITY_FILE, new_identity() + "\n")
            except LocalpersError as exc:  # name the user's folder, not the hidden staging one
                raise LocalpersError(str(exc).replace(str(building), str(self._user(name).dir))) from None
            self._commit_staging(building, name)
        finally:
            shutil.rmtree(building, ignore_errors=True)
        if activate:
            self._activate_if_none(name)
        return self.get(name)

    def active_name(self) -> str | None:
        """The active user's name; None if none is set or the named user no longer exists."""
        pointer = read_json_object(
            self.active_path, "run `localpers user use NAME` to choose the active user"
        )
        if pointer is None:
            return None
        name = pointer.get("user")
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            # malformed content, as `[]` there is: exit 2 whichever way the file is damaged
            raise InputError(
                f"{self.active_path} is damaged (bad 'user'); run `localpers user use NAME` to choose the active user"
            )
        folder = self._user(name).dir
        if not folder.is_dir() and os.path.lexists(folder):  # not a user who was deleted: one out of reach
            raise StorageError(f"{staging.not_a_folder(folder)}; no command can use user {name!r} until then")
        return name if folder.is_dir() else None

    def use(self, name: str) -> User:
        """Make `name` the active user."""
        user = self.get(name)
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.active_path, json.dumps({"user": name}) + "\n")
        return user

    def resolve(self, name: str | None) -> User:
        """The named user, or the active one; a one-line error if neither exists."""
        if name is not None:
            return self.get(name)
        self.check_folder()
        active = self.active_name()
        if active is None:
            names = self.list()
            if not names:
                raise LocalpersError("no active user: run `localpers user create NAME`")
            # e.g. the active user was deleted: say which users there are rather than to create one
            shown = ", ".join(names[:_NAMES_SHOWN]) + (", ..." if len(names) > _NAMES_SHOWN else "")
            raise LocalpersError(
                f"no active user; choose one with `localpers user use NAME` (users: {shown})"
            )
        return self.get(active)

    def delete(self, name: str) -> str | None:
        """Remove the user's folder (history, vector, state) and the active pointer if it names them; what could
        not be done after the user was gone (the pointer left in place), or None."""
        user = self.get(name)
        if user.dir.is_symlink():
            raise LocalpersError(
                f"user {name!r} is a link to {user.dir.resolve()}, not a folder localpers made; nothing was"
                f" deleted: remove the link {user.dir} and, if you wish, what it points to yourself"
            )
        doomed = self._staging_dir("deleting", create=False)
        with user.locked():  # waits for a change in progress; those waiting after it are refused
            os.rename(user.dir, doomed)  # the user disappears in one step; the files go next
        try:
            pointer = read_json_object(self.active_path, "")
        except LocalpersError:
            pointer = {"user": name}  # a damaged pointer may name this user: remove it too
        pointer_left = None
        if pointer is not None and pointer.get("user") == name:
            try:
                self.active_path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:  # the user is gone already: its files go all the same
                pointer_left = f"{self.active_path} could not be removed ({exc.strerror or exc})"
        failures = staging.remove_tree(doomed)
        if failures:
            raise StorageError(
                f"user {name!r} is gone from localpers, but {len(failures)} of its files could not be deleted"
                f" (first: {failures[0]}); delete {doomed} yourself"
            )
        self._sweep()
        if pointer_left is not None:
            # a pointer to a user who does not exist reads as no active user: harmless, so said, not failed
            return (
                f"{pointer_left}: move it away or make its folder writable, then choose the active user with"
                " `localpers user use NAME`"
            )
        return None

    def export(
        self,
        name: str,
        dest: Path | str,
        with_history: bool = False,
        overwrite: bool = False,
        check: Callable[[User], None] | None = None,
    ) -> Path:
        """Write one .zip with the user's state (cluster, fit report) and vector; history only if asked.

        `dest` is the zip's path, or an existing folder to write `localpers-user-<name>.zip` into. `check` (the
        command line gives the one `import_` is given) refuses the user's fit before anything is written.
        """
        user = self.get(name)
        dest = Path(dest)
        if dest.is_dir():
            dest = dest / f"localpers-user-{name}.zip"
        try:
            resolved = dest.resolve()
        except (OSError, RuntimeError):  # Python 3.11 raises RuntimeError for a link that loops
            raise InputError(f"{dest}: a link that loops or cannot be followed; choose a file path") from None
        # a history kept elsewhere through a link (a layout localpers supports): --force replaced it with a zip.
        # realpath never raises: a loop among the user's own files is theirs to report, not the destination's.
        kept = {
            Path(os.path.realpath(self.active_path)): "localpers' own active.json",
            Path(os.path.realpath(user.history_path)): f"the file user {name!r} keeps its history in",
        }
        if resolved.is_relative_to(self.users_dir.resolve()):
            raise InputError(
                f"{dest} is inside localpers' users folder {self.users_dir}, whose files it would replace or"
                " mix with; choose a path outside it"
            )
        if resolved in kept:
            raise InputError(
                f"{dest} is {kept[resolved]}, which the archive would replace; choose another path"
            )
        if dest.exists() and not dest.is_file():
            raise InputError(
                f"{dest} exists and is not a regular file (a folder, device, FIFO or socket); it is never"
                " replaced: choose a file path"
            )
        if os.path.lexists(dest) and not overwrite:  # a link to nothing too: the export would replace it
            raise LocalpersError(f"{dest} already exists; choose another path or pass --force")
        members = fit_members(user)
        if check is not None:
            _check_before_export(user, check)
        # lexists: a history behind a link to nothing (an unmounted drive) is refused by history(), not left out
        # of an archive that says it holds the history
        if with_history and os.path.lexists(user.history_path):
            count = len(user.history())  # validated before exporting
            # a history made longer by hand works here, but an import would refuse the archive
            check_history_size(
                count,
                what=f"user {user.name!r} has",
                hint=f"e.g. `localpers history remove --oldest {count - MAX_HISTORY_ITEMS} --user {user.name}`,"
                " then export: an import refuses more",
            )
            members["history.jsonl"] = read_regular_file(
                user.history_path, MAX_HISTORY_FILE_BYTES, what="history file", stored=True
            )
        # the manifest's cluster from the state archived, not from a later read of a fit committed meanwhile
        archived = parse_json(members["state.json"]) if "state.json" in members else {}
        if isinstance(archived, dict) and archived:
            members["state.json"] = marked_for_history(user, archived, "history.jsonl" in members)
        data = pack_archive(name, archived.get("cluster") if isinstance(archived, dict) else None, members)
        if not dest.parent.is_dir():
            raise InputError(f"{dest.parent} is not a folder; create it or choose another path")
        atomic_write_bytes(dest, data)
        return dest

    def import_(
        self,
        archive: Path | str,
        name: str | None = None,
        check: Callable[[User], None] | None = None,
        *,
        activate: bool = True,
    ) -> User:
        """A new user from an `export` archive, under its own name or `name`; checked before it appears (its
        vector and history here, and by `check`, which the command line gives the reading a rewrite makes of a
        fit: this layer cannot import it). With `activate`, it becomes the active user when none is active."""
        archive = Path(archive)
        manifest, members = read_archive(archive)
        if name is None:
            name = manifest.get("name")
            if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
                shown = "missing" if name is None else f"{one_line(repr(name), 40)}, not a valid user name"
                raise InputError(
                    f"{archive}: manifest.json field 'name' is {shown}; import it with --as NAME"
                )
        target = validate_new_name(name, "import it under another name with --as NAME")
        self._check_free(target, "import under another name with --as NAME")
        building = self._staging_dir("importing")
        try:
            try:
                for member, data in members.items():
                    staging.write_synced(building / member, data)
                staging.write_synced(building / IDENTITY_FILE, (new_identity() + "\n").encode("ascii"))
                fsync_directory(building)  # the files on disk before the folder is renamed into place
            except OSError as exc:
                raise StorageError(
                    f"cannot write user {target!r} into {self.users_dir} ({exc.strerror or exc}); nothing was"
                    " imported: free some disk space or fix the folder's permissions, then import again"
                ) from None
            candidate = User(target, building)
            try:
                items = candidate.history()
                candidate._load_vector()
                if check is not None:
                    check(candidate)
            except LocalpersError as exc:
                # the advice a damaged file's message ends with is for a user on this device ("run localpers
                # fit"), which this is not yet
                detail = str(exc).replace(f"{building}{os.sep}", "").rsplit("; ", 1)[0]
                raise InputError(
                    f"{archive} holds a damaged user: {detail}; export it again on the device it came from"
                ) from None
            check_history_size(len(items), what=f"{archive} has")  # its own advice holds for an archive
            self._commit_staging(building, target)
        finally:
            shutil.rmtree(building, ignore_errors=True)
        if activate:
            self._activate_if_none(target)
        return self.get(target)

    def _check_free(self, name: str, advice: str) -> None:
        """Refuse a name whose folder is taken: by a user, or by something else (a file, a dangling link) that
        no command lists, which must be moved away by hand."""
        path = self._user(name).dir
        if path.is_dir():
            raise LocalpersError(f"user {name!r} already exists; {advice}")
        if os.path.lexists(path):
            raise LocalpersError(
                f"{path} exists and is not a user's folder (a file or a dangling link); move it away, or {advice}"
            )

    def check_folder(self) -> None:
        """Refuse a file (or a link to nothing) where the users' folder goes (`staging.check_users_folder`)."""
        staging.check_users_folder(self.users_dir)

    def _staging_dir(self, purpose: str, create: bool = True) -> Path:
        """A hidden folder beside the users (same filesystem, so renames are atomic); list() skips it."""
        return staging.staging_dir(self.users_dir, purpose, create)

    def _commit_staging(self, built: Path, name: str) -> None:
        staging.commit_staging(built, self._user(name).dir, name)

    def _sweep(self) -> None:
        staging.sweep(self.users_dir)

    def _activate_if_none(self, name: str) -> None:
        try:
            active = self.active_name()
        except LocalpersError:
            return  # leave a damaged pointer for `user use` to repair, rather than guess
        if active is None:
            self.use(name)


def _check_before_export(user: User, check: Callable[[User], None]) -> None:
    """Run `check` on `user`, refusing the export in one line (nothing written) where it refuses: an archive
    `import_` refuses, with advice to export it again, would send the user round in a loop."""
    try:
        check(user)
    except LocalpersError as exc:  # the message names the file and ends with `localpers fit --user NAME`
        raise type(exc)(f"user {user.name!r} was not exported: {exc}", exit_code=exc.exit_code) from None
