"""A user's history as their folder keeps it: read checked, written atomically with the files derived from it.

`UserHistory` is the base class of `localpers.users.folder.User` that owns `history.jsonl`: the stored items
(`history`, refused when the user's folder is gone), their ids (read again only after the file was replaced),
the history's BM25 retrieval index for history-conditioned prompts (`history_index`), and `save_history`,
which first forgets what is derived from the old history (the index, the engine's kept examples blocks), then
writes the history, its index and the items' ordinals. `User` creates every attribute it reads (`name`, `dir`)
and provides the write lock (`User.locked`).

What it does not do: state.json, the vector or anything else in the folder (`localpers.users.folder`), parse
or check items (`localpers.users.history`), or build prompts (`localpers.users.history_index`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from localpers.atomic import atomic_write_text
from localpers.engine.prefix_files import remove_kept
from localpers.errors import LocalpersError
from localpers.regular_files import read_regular_file
from localpers.tasks import Task
from localpers.users.history import (
    MAX_HISTORY_FILE_BYTES,
    HistoryItem,
    check_history_bytes,
    check_history_size,
    read_stored_history,
    refuse_dangling_link,
    serialize_history,
)
from localpers.users.ordinals import updated_ordinals, write_ordinals

if TYPE_CHECKING:
    from localpers.users.history_index import HistoryIndex


class UserHistory:
    """One user's stored history and what is derived from it; a base class of `User`, which creates `name`
    and `dir`."""

    name: str
    dir: Path
    locked: Callable[..., contextlib.AbstractContextManager[None]]  # `User.locked`: this user's write lock

    @property
    def history_path(self) -> Path:
        return self.dir / "history.jsonl"

    def history(self) -> list[HistoryItem]:
        """The stored history items, in order; empty if none were imported (refused if the user is gone)."""
        items = read_stored_history(self.history_path)
        if not items:
            self._refuse_if_gone()
        return items

    def _refuse_if_gone(self) -> None:
        """A one-line error when the user's folder no longer exists (deleted while this command ran): its files
        must not read as a user with no history and no fit."""
        if not self.dir.is_dir():
            raise LocalpersError(f"user {self.name!r} no longer exists (deleted while this command ran)")

    def history_ids(self) -> frozenset[str]:
        """The ids of the stored history's items; read again only when the file was replaced since the last call
        (a fit asks at each of its cache writes whether an item was removed meanwhile)."""
        stamp = _file_stamp(self.history_path)  # before reading: a file replaced meanwhile never matches
        cached = _history_ids.get(self.history_path)
        if stamp is not None and cached is not None and cached[0] == stamp:
            return cached[1]
        ids = frozenset(item.id for item in self.history())
        if stamp is not None:
            _history_ids[self.history_path] = (stamp, ids)
        return ids

    def save_history(
        self, items: list[HistoryItem], *, removing: bool = False, on_saved: Callable[[], None] | None = None
    ) -> None:
        """Write the history, then its retrieval index (a stale index is noticed and rebuilt on read).

        `removing`: `items` is the stored history less some items, so it is written even if still over the
        item limit (a history made longer by hand must be reducible step by step). `on_saved` is called as soon
        as the history itself is written, before its derived files: a stop after it came after the work.
        """
        text = serialize_history(items)
        if not removing:
            check_history_size(len(items), what=f"user {self.name!r} would have")
        # even when removing: what reading it back would refuse must not be written
        check_history_bytes(len(text.encode("utf-8")), items, what=f"user {self.name!r}")
        from localpers.users.history_index import HistoryIndex  # its BM25 index loads numpy

        with self.locked():
            ordinals = updated_ordinals(self.dir, self._stored_history_or_none, items)
            # what is derived from the old history goes first (the index holds every item's text, the engine's
            # kept states an examples block): a stop before the history is written then leaves only caches to
            # rebuild, never a removed item's text
            HistoryIndex.forget(self.dir)
            remove_kept(self.dir)
            # a history kept elsewhere through a link (a synced folder, another drive) stays there
            atomic_write_text(self.history_path, text, through_link=True)
            if on_saved is not None:
                on_saved()
            HistoryIndex.write(self.dir, text, items)
            write_ordinals(self.dir, ordinals)

    def _stored_history_or_none(self) -> list[HistoryItem]:
        """The history as stored, or none when it cannot be read (it is being replaced)."""
        try:
            return self.history()
        except LocalpersError:
            return []

    def history_index(self, task: Task) -> HistoryIndex:
        """The user's examples for `task` with their BM25 index, for history-conditioned prompts.

        The engine may keep its state of the prompts' examples block in this folder (`write_lock`): only while
        the history is still the file read here, so a block read before an item was removed is never kept.
        """
        from localpers.users.history_index import HistoryIndex

        stamp = _file_stamp(self.history_path)  # before reading: a file replaced meanwhile never matches
        if self.history_path.exists():
            # as every reader of the history: a FIFO or a link to /dev/zero is refused, not read until it ends
            raw = read_regular_file(
                self.history_path, MAX_HISTORY_FILE_BYTES, what="history file", stored=True
            )
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                self.history()  # raises the history's own one-line error, naming the line and the fix
                raise
        else:
            refuse_dangling_link(self.history_path)
            text = ""

        def write_cache(items: Sequence[HistoryItem]) -> None:
            # only while the history is still the text read: a reader that parsed it before an item was removed
            # (or the user was deleted and made anew) must not write the old texts back; busy: left to the next
            with contextlib.suppress(LocalpersError), self._locked_while_history_is(stamp):
                HistoryIndex.write(self.dir, text, items)

        index = HistoryIndex.load(self.dir, text, lambda: self.history() if text else [], task, write_cache)
        index.user_dir, index.write_lock = self.dir, lambda: self._locked_while_history_is(stamp)
        return index

    @contextlib.contextmanager
    def _locked_while_history_is(self, stamp: tuple[int, int, int] | None) -> Iterator[None]:
        """This user's write lock, taken without waiting, if the history file is still the one `stamp` saw."""
        with self.locked(wait_seconds=0.0):
            if _file_stamp(self.history_path) != stamp:
                raise LocalpersError(f"user {self.name!r}'s history changed since it was read")
            yield


# history file -> (its stamp when read, its items' ids): `User.history_ids`'s memo
_history_ids: dict[Path, tuple[tuple[int, int, int], frozenset[str]]] = {}


def _file_stamp(path: Path) -> tuple[int, int, int] | None:
    """(inode, mtime ns, size) of `path`: an atomic replace gives a new inode; None when it is absent."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns, info.st_size
