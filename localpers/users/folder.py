"""One user's folder: their history, fitted state and vector, each read checked and each write atomic.

Layout of `users/<name>/` (the folders are listed and made by `localpers.users.store.UserStore`):

    history.jsonl                    the user's history (localpers.users.history format)
    vector-<sha256[:16]>.safetensors tensor "lambda" float32 (D,) plus string metadata (users/vector_file)
    state.json                       cluster, method, fit report, timestamps, and the
                                     file name and sha256 of the current vector
    .lock, .identity                 the write lock and the folder's random token (`localpers.users.lock`)
    .fit.lock                        held while a fit of the user runs (`localpers.users.lock.fit_lock`)
    history_ordinals.json            each item's place in the order items were added, kept across
                                     removals (`localpers.users.ordinals`; the fit's prompt groups)
    prefix-<sha256[:32]>.kv          the engine's state of the user's examples block, a cache
                                     (`localpers.engine.prefix_files`; never exported, removed
                                     whenever the history changes)

A fit is committed in two steps: the vector goes to a new content-addressed file, then state.json is
replaced to name it. State is the commit point: an interruption before it leaves the previous state
naming the previous vector, which is still there; stale vector files are removed afterwards. Reading
checks the vector's sha256 against state.json and refuses a mismatch. Every file is written to a
temporary file in the same folder (a linked history.jsonl: beside the file it links to), fsynced, then
`os.replace`d. Damaged files raise a one-line
`LocalpersError` naming the file and what to do. Methods keep their own files beside these, written
through the same atomic helpers. This module does not fit or embed anything, and knows no other user.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localpers.atomic import atomic_write_bytes, atomic_write_text
from localpers.engine.prefix_files import remove_kept
from localpers.errors import InputError, LocalpersError
from localpers.regular_files import STATE_FILE_LIMIT, read_regular_file
from localpers.tasks import Task
from localpers.untrusted import JSONProblem, parse_json, reject_duplicate_keys
from localpers.users.history import (
    MAX_HISTORY_FILE_BYTES,
    HistoryItem,
    check_history_bytes,
    check_history_size,
    read_stored_history,
    refuse_dangling_link,
    serialize_history,
)
from localpers.users.lock import DEFAULT_WAIT_SECONDS, fit_lock, read_identity, user_lock
from localpers.users.ordinals import updated_ordinals, write_ordinals
from localpers.users.vector_file import read_vector_file, vector_file_bytes

if TYPE_CHECKING:
    import numpy as np

    from localpers.users.history_index import HistoryIndex

REJECTED_FILE = "negatives_user.jsonl"
VECTOR_FILE_PATTERN = re.compile(r"vector-[0-9a-f]{16}\.safetensors")
# state.json keys this module owns; callers' keys (cluster, method, report, ...) pass through untouched.
_VECTOR_KEYS = ("vector_file", "vector_sha256", "vector_dim")
_FIT_READS = 3  # reads of state.json and its vector while other commands' fits commit (`fit_files`)


def now() -> str:
    """The current UTC time as the user's files record it (ISO 8601, seconds)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def read_json_object(path: Path, fix: str) -> dict[str, Any] | None:
    """The JSON object in `path`, None if the file is absent; a one-line error if it is damaged."""
    try:
        if not path.exists():  # absent, or a link to nothing (read as absent, as before)
            return None
    except OSError as exc:  # a folder on the way that this account cannot read (Path.exists raises then)
        raise LocalpersError(
            f"{path}: cannot read ({exc.strerror or exc}); give your account access to its folder"
        ) from None
    if path.is_dir():
        raise LocalpersError(f"{path} is a folder where localpers keeps a file; move it away")
    # a FIFO, a device (a link to /dev/zero) or a huge file is refused before it is read
    try:
        raw = read_regular_file(path, STATE_FILE_LIMIT, what="state file", stored=True)
    except FileNotFoundError:
        return None
    except LocalpersError as exc:
        if not fix:
            raise
        raise type(exc)(f"{exc}; {fix}") from None
    try:
        # NaN or 1e999 are no value localpers writes (json.dumps(allow_nan=False)); read, they made `user export`
        # end in a traceback rewriting the state. A key named twice is no file localpers wrote either: which was
        # meant is unknown, so it is refused rather than the last one taken.
        value = parse_json(raw, allow_nan=False, object_pairs_hook=reject_duplicate_keys)
    except JSONProblem as exc:
        raise InputError(f"{path} is damaged (not valid JSON: {exc}); {fix}") from None
    if not isinstance(value, dict):
        raise InputError(f"{path} is damaged (expected a JSON object); {fix}")
    return value


# state.json's mark of a fit exported without the history it stands for (set by `user export`, so an imported
# user has it): `fit` keeps that fit until items are added (`localpers.methods.card.user_fit.fit_without_history`);
# a fit writes a state without it
IMPORTED_WITHOUT_HISTORY = "imported_without_history"


@dataclass(frozen=True)
class User:
    """One user's folder. Read methods validate what they read; save methods write atomically."""

    name: str
    dir: Path
    # The folder's `.identity` token when this object was made (`UserStore.get`); every locked write checks
    # it, so a command started before the user was deleted and created anew never writes into the new one.
    identity: str | None = field(default=None, compare=False)

    @property
    def history_path(self) -> Path:
        return self.dir / "history.jsonl"

    @property
    def state_path(self) -> Path:
        return self.dir / "state.json"

    @property
    def rejected_path(self) -> Path:
        """Outputs the user turned down in the TUI, with their inputs (`localpers.tui.userdata` writes them)."""
        return self.dir / REJECTED_FILE

    @property
    def refit_advice(self) -> str:
        """What repairs this user's fit, naming them: a bare `localpers fit` fits the active user, maybe another."""
        return f"run `localpers fit --user {self.name}` again"

    def locked(self, wait_seconds: float = DEFAULT_WAIT_SECONDS) -> contextlib.AbstractContextManager[None]:
        """Hold this user's write lock: wrap each read-modify-write of its files (`localpers.users.lock`)."""
        return user_lock(
            self.dir, who=f"user {self.name!r}", identity=self.identity, wait_seconds=wait_seconds
        )

    def fitting(self, wait_seconds: float = 0.0) -> contextlib.AbstractContextManager[None]:
        """Hold this user's fit lock for a whole fit: a second fit of the user is refused (`lock.fit_lock`)."""
        return fit_lock(self.dir, who=f"user {self.name!r}", wait_seconds=wait_seconds)

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

    def made_anew(self) -> bool:
        """Whether the folder now holds another identity token than this object read: the user was deleted and
        made again under the same name (`user import --as`) since. A folder without a token, or one this object
        read none from, cannot tell and says no."""
        return self.identity is not None and read_identity(self.dir) not in (None, self.identity)

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

    def state(self) -> dict[str, Any]:
        """state.json as a dict ({} when absent)."""
        state = read_json_object(self.state_path, f"remove it and {self.refit_advice}")
        if state is None:
            self._refuse_if_gone()
        return state if state is not None else {}

    def save_state(self, state: dict[str, Any]) -> None:
        """Write `state`, keeping the vector link and creation time of the current state unless given."""
        with self.locked():
            try:
                current = self.state()
            except LocalpersError:
                current = {}  # a damaged state.json is what this call repairs
            kept = {k: current[k] for k in (*_VECTOR_KEYS, "created_at") if k in current and k not in state}
            self._write_state({**state, **kept})

    def _write_state(self, state: dict[str, Any]) -> None:
        try:
            text = state_json({**state, "updated_at": now()})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"user state must be JSON-serialisable: {exc}") from None
        atomic_write_text(self.state_path, text + "\n")

    def vector_path(self, state: dict[str, Any] | None = None) -> Path | None:
        """The file of the current vector, as named by state.json; None if the user has no vector."""
        name = (self.state() if state is None else state).get("vector_file")
        if name is None:
            return None
        if not isinstance(name, str) or not VECTOR_FILE_PATTERN.fullmatch(name):
            raise InputError(
                f"{self.state_path} is damaged (bad 'vector_file'); remove it and {self.refit_advice}"
            )
        return self.dir / name

    def vector(self) -> np.ndarray | None:
        """The fitted vector λ_u (float32, shape (D,)), or None if the user has none."""
        return self.fit_files()[1]

    def vector_metadata(self, state: dict[str, Any] | None = None) -> dict[str, str]:
        """The metadata strings saved with the vector (e.g. the bundle sha); {} without a vector. `state`: the
        state.json of the fit already read (`fit_files`), whose vector is meant."""
        loaded = self._load_vector(self.fit_files()[0] if state is None else state)
        return {} if loaded is None else loaded[1]

    def fit_files(self) -> tuple[dict[str, Any], np.ndarray | None]:
        """state.json and the vector it names, read as one pair.

        Another command's fit commits between the two reads (its vector written, state.json replaced, the old
        vector removed): read separately, a rewrite took one fit's state with the next one's vector, or the
        removed vector for a damaged fit. A pair that fails to read while state.json changed is read again.
        """
        for attempt in range(_FIT_READS):
            state = self.state()
            try:
                loaded = self._load_vector(state)
            except LocalpersError:
                if attempt + 1 == _FIT_READS or self.state() == state:  # unchanged: the files' own fault
                    raise
                continue
            return state, None if loaded is None else loaded[0]
        raise AssertionError("unreachable: the last read returns or raises")

    def _load_vector(self, state: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, str]] | None:
        state = self.state() if state is None else state
        path = self.vector_path(state)
        if path is None:
            return None
        if not path.exists():
            raise LocalpersError(
                f"{path} is missing although {self.state_path.name} names it; {self.refit_advice}"
            )
        data = read_regular_file(path, STATE_FILE_LIMIT, what="user vector", stored=True)
        return read_vector_file(path, data, state, self.state_path, self.refit_advice)

    def save_vector(self, vector: np.ndarray, meta: dict[str, str] | None = None) -> None:
        """Replace the vector only, keeping the rest of the state (see `save_fit`)."""
        with self.locked():
            self.save_fit(vector, self.state(), meta)

    def save_fit(
        self, vector: np.ndarray | None, state: dict[str, Any], meta: dict[str, str] | None = None
    ) -> None:
        """Store a fit: the vector (None = no vector, e.g. cold start) and the state that goes with it.

        The vector is written first to its own new file, then state.json (naming that file and its
        sha256) replaces the old one, so an interruption at any point leaves a consistent pair.
        """
        new_state = {k: v for k, v in state.items() if k not in _VECTOR_KEYS}
        keep: str | None = None
        data = None if vector is None else vector_file_bytes(vector, meta)
        with self.locked():
            new_state.setdefault("created_at", self._created_at())
            if data is not None:
                sha = hashlib.sha256(data).hexdigest()
                keep = f"vector-{sha[:16]}.safetensors"
                atomic_write_bytes(self.dir / keep, data)
                new_state.update(vector_file=keep, vector_sha256=sha, vector_dim=len(vector))
            self._write_state(new_state)
            # under the lock: another fit's new vector is never taken for a stale one before its state names it
            for stale in self.dir.glob("vector-*.safetensors"):
                if stale.name != keep and not stale.is_dir():  # a folder of that name is not ours to remove
                    with contextlib.suppress(FileNotFoundError):
                        stale.unlink()

    def _created_at(self) -> str:
        try:
            return str(self.state().get("created_at") or now())
        except LocalpersError:
            return now()

    def disk_bytes(self) -> int:
        """Bytes this user takes on disk (all files in the folder; one that goes while counted, e.g. a kept
        prefix a rewrite evicts or a write's temp file, counts 0)."""
        total = 0
        for path in self.dir.rglob("*"):
            with contextlib.suppress(FileNotFoundError):
                total += path.stat().st_size if path.is_file() else 0
        return total


# history file -> (its stamp when read, its items' ids): `User.history_ids`'s memo
_history_ids: dict[Path, tuple[tuple[int, int, int], frozenset[str]]] = {}


def _file_stamp(path: Path) -> tuple[int, int, int] | None:
    """(inode, mtime ns, size) of `path`: an atomic replace gives a new inode; None when it is absent."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns, info.st_size


def check_history_limit(history_limit: int) -> int:
    """`history_limit` if it is at least 1: `items[-0:]` is every item, the opposite of what 0 asks for."""
    if history_limit < 1:
        raise ValueError(f"history_limit must be at least 1 (None: every item), not {history_limit}")
    return history_limit


def history_for(user: User, history_limit: int | None, method: str) -> list[HistoryItem]:
    """The user's history (the `history_limit` most recent items), refusing an empty one for `method`."""
    items = user.history()
    if history_limit is not None:
        items = items[-check_history_limit(history_limit) :]
    if not items:
        raise LocalpersError(
            f"user {user.name!r} has no history: {method} learns from it; add items with `localpers history import`"
        )
    return items


def state_json(state: dict[str, Any]) -> str:
    """One top-level field per line, each value compact: readable, and the token bias stays a few KB."""

    def compact(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))

    return "{\n" + ",\n".join(f"  {compact(key)}: {compact(value)}" for key, value in state.items()) + "\n}"
