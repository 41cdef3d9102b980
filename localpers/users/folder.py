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
through the same atomic helpers. history.jsonl and what is derived from it are read and written by `User`'s
base class `localpers.users.folder_history.UserHistory`. This module does not fit or embed anything, and knows
no other user.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localpers.atomic import atomic_write_bytes, atomic_write_text
from localpers.errors import InputError, LocalpersError
from localpers.regular_files import STATE_FILE_LIMIT, read_regular_file
from localpers.untrusted import JSONProblem, parse_json, reject_duplicate_keys
from localpers.users.folder_history import UserHistory
from localpers.users.history import HistoryItem
from localpers.users.lock import DEFAULT_WAIT_SECONDS, fit_lock, read_identity, user_lock
from localpers.users.vector_file import read_vector_file, vector_file_bytes

if TYPE_CHECKING:
    import numpy as np

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
class User(UserHistory):
    """One user's folder. Read methods validate what they read; save methods write atomically. The history's
    methods (`history`, `history_ids`, `save_history`, `history_index`) are `UserHistory`'s."""

    name: str
    dir: Path
    # The folder's `.identity` token when this object was made (`UserStore.get`); every locked write checks
    # it, so a command started before the user was deleted and created anew never writes into the new one.
    identity: str | None = field(default=None, compare=False)

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

    def made_anew(self) -> bool:
        """Whether the folder now holds another identity token than this object read: the user was deleted and
        made again under the same name (`user import --as`) since. A folder without a token, or one this object
        read none from, cannot tell and says no."""
        return self.identity is not None and read_identity(self.dir) not in (None, self.identity)

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
