"""Named users on this device, one folder each, with every write atomic.

Layout under `paths.data_dir()` (or the `root` given to `UserStore`):

    active.json                                   {"user": "ann"}: the active user
    users/<name>/history.jsonl                    the user's history (localpers.users.history format)
    users/<name>/vector-<sha256[:16]>.safetensors tensor "lambda" float32 (D,) plus string metadata
    users/<name>/state.json                       cluster, method, fit report, timestamps, and the
                                                  file name and sha256 of the current vector

A fit is committed in two steps: the vector goes to a new content-addressed file, then state.json is
replaced to name it. State is the commit point: an interruption before it leaves the previous state
naming the previous vector, which is still there; stale vector files are removed afterwards. Reading
checks the vector's sha256 against state.json and refuses a mismatch. Every file is written to a
temporary file in the same folder, fsynced, then `os.replace`d. Damaged files raise a one-line
`LocalpersError` naming the file and what to do. Nothing of a user's text is written outside its folder
(except `export`, to the destination the user names). This module does not fit or embed anything.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import struct
import zipfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from localpers import paths
from localpers.atomic import atomic_write_bytes, atomic_write_text, fsync_directory
from localpers.errors import InputError, LocalpersError
from localpers.tasks import Task
from localpers.untrusted import JSONProblem, one_line, parse_json
from localpers.users.history import HistoryItem, check_history_size, read_stored_history, serialize_history
from localpers.users.history_prompt import HistoryIndex

NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
VECTOR_TENSOR = "lambda"
VECTOR_FILE_PATTERN = re.compile(r"vector-[0-9a-f]{16}\.safetensors")
ARCHIVE_FORMAT = "localpers-user"
ARCHIVE_VERSION = 1
MAX_ARCHIVE_MEMBER_BYTES = 64 * 1024 * 1024
# An export holds manifest.json, state.json, at most one vector and optionally history.jsonl: a zip with
# more members, or more bytes in all, is not one (and may be a zip bomb).
MAX_ARCHIVE_MEMBERS = 4
MAX_ARCHIVE_TOTAL_BYTES = 64 * 1024 * 1024
MAX_ARCHIVE_FILE_BYTES = 64 * 1024 * 1024
# state.json keys this module owns; callers' keys (cluster, method, report, ...) pass through untouched.
_VECTOR_KEYS = ("vector_file", "vector_sha256", "vector_dim")
_REFIT = "run `localpers fit` again"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _read_json_object(path: Path, fix: str) -> dict[str, Any] | None:
    """The JSON object in `path`, None if the file is absent; a one-line error if it is damaged."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LocalpersError(f"{path}: cannot read ({exc.strerror}); {fix}") from None
    try:
        value = parse_json(raw)
    except JSONProblem as exc:
        raise InputError(f"{path} is damaged (not valid JSON: {exc}); {fix}") from None
    if not isinstance(value, dict):
        raise InputError(f"{path} is damaged (expected a JSON object); {fix}")
    return value


def validate_name(name: str) -> str:
    """`name` if it is a valid user name, else a one-line error saying what is allowed."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise LocalpersError(
            f"invalid user name {name!r}: use 1-32 lowercase letters, digits, '-' or '_', "
            "starting with a letter or digit"
        )
    return name


def _vector_bytes(vector: np.ndarray, meta: dict[str, str] | None) -> bytes:
    """The safetensors file for a user vector; rejects anything but a finite, non-empty 1-D array."""
    from safetensors.numpy import save

    array = np.ascontiguousarray(np.asarray(vector, dtype=np.float32))
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"a user vector must be a non-empty 1-D array, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError("a user vector must hold finite numbers only")
    meta = dict(meta or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise TypeError("vector metadata must map strings to strings")
    return save({VECTOR_TENSOR: array}, metadata=meta or None)


def _safetensors_metadata(data: bytes) -> dict[str, str]:
    """The `__metadata__` strings of a safetensors file already known to be valid."""
    (header_length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_length])
    return dict(header.get("__metadata__") or {})


@dataclass(frozen=True)
class User:
    """One user's folder. Read methods validate what they read; save methods write atomically."""

    name: str
    dir: Path

    @property
    def history_path(self) -> Path:
        return self.dir / "history.jsonl"

    @property
    def state_path(self) -> Path:
        return self.dir / "state.json"

    def history(self) -> list[HistoryItem]:
        """The stored history items, in order; empty if none were imported."""
        return read_stored_history(self.history_path)

    def save_history(self, items: list[HistoryItem]) -> None:
        """Write the history, then its retrieval index (a stale index is noticed and rebuilt on read)."""
        check_history_size(len(items), what=f"user {self.name!r} would have")
        text = serialize_history(items)
        atomic_write_text(self.history_path, text)
        HistoryIndex.write(self.dir, text, items)

    def history_index(self, task: Task) -> HistoryIndex:
        """The user's examples for `task` with their BM25 index, for history-conditioned prompts."""
        try:
            text = self.history_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            text = ""
        return HistoryIndex.load(self.dir, text, lambda: self.history() if text else [], task)

    def state(self) -> dict[str, Any]:
        """state.json as a dict ({} when absent)."""
        state = _read_json_object(self.state_path, f"remove it and {_REFIT}")
        return state if state is not None else {}

    def save_state(self, state: dict[str, Any]) -> None:
        """Write `state`, keeping the vector link and creation time of the current state unless given."""
        try:
            current = self.state()
        except LocalpersError:
            current = {}  # a damaged state.json is what this call repairs
        kept = {k: current[k] for k in (*_VECTOR_KEYS, "created_at") if k in current and k not in state}
        self._write_state({**state, **kept})

    def _write_state(self, state: dict[str, Any]) -> None:
        try:
            text = _state_json({**state, "updated_at": _now()})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"user state must be JSON-serialisable: {exc}") from None
        atomic_write_text(self.state_path, text + "\n")

    def vector_path(self, state: dict[str, Any] | None = None) -> Path | None:
        """The file of the current vector, as named by state.json; None if the user has no vector."""
        name = (self.state() if state is None else state).get("vector_file")
        if name is None:
            return None
        if not isinstance(name, str) or not VECTOR_FILE_PATTERN.fullmatch(name):
            raise LocalpersError(f"{self.state_path} is damaged (bad 'vector_file'); remove it and {_REFIT}")
        return self.dir / name

    def vector(self) -> np.ndarray | None:
        """The fitted vector λ_u (float32, shape (D,)), or None if the user has none."""
        loaded = self._load_vector()
        return None if loaded is None else loaded[0]

    def vector_metadata(self) -> dict[str, str]:
        """The metadata strings saved with the vector (e.g. the bundle sha); {} without a vector."""
        loaded = self._load_vector()
        return {} if loaded is None else loaded[1]

    def _load_vector(self) -> tuple[np.ndarray, dict[str, str]] | None:
        from safetensors.numpy import load

        state = self.state()
        path = self.vector_path(state)
        if path is None:
            return None
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise LocalpersError(
                f"{path} is missing although {self.state_path.name} names it; {_REFIT}"
            ) from None
        except OSError as exc:
            raise LocalpersError(f"{path}: cannot read ({exc.strerror}); {_REFIT}") from None
        if hashlib.sha256(data).hexdigest() != state.get("vector_sha256"):
            raise LocalpersError(
                f"{path} does not match the sha256 recorded in {self.state_path.name} "
                f"(changed or damaged); {_REFIT}"
            )
        try:
            tensors = load(data)
        except Exception as exc:  # safetensors raises several types for malformed files
            raise LocalpersError(f"{path} is not a readable safetensors file ({exc}); {_REFIT}") from None
        array = tensors.get(VECTOR_TENSOR)
        if array is None:
            raise LocalpersError(f"{path} has no tensor {VECTOR_TENSOR!r}; {_REFIT}")
        if array.dtype != np.float32 or array.ndim != 1 or array.size == 0:
            raise LocalpersError(
                f"{path}: tensor {VECTOR_TENSOR!r} is {array.dtype} {tuple(array.shape)}, "
                f"expected float32 (D,); {_REFIT}"
            )
        dim = state.get("vector_dim")
        if dim is not None and (not isinstance(dim, int) or isinstance(dim, bool)):
            raise InputError(
                f"{self.state_path} is damaged: field 'vector_dim' is {one_line(repr(dim), 40)}"
                f" ({type(dim).__name__}), not an integer; {_REFIT}"
            )
        if dim is not None and dim != array.size:
            raise InputError(
                f"{path} has {array.size} values but field 'vector_dim' of {self.state_path.name} says {dim};"
                f" {_REFIT}"
            )
        if not np.all(np.isfinite(array)):
            raise LocalpersError(f"{path} holds non-finite values; {_REFIT}")
        return array, _safetensors_metadata(data)

    def save_vector(self, vector: np.ndarray, meta: dict[str, str] | None = None) -> None:
        """Replace the vector only, keeping the rest of the state (see `save_fit`)."""
        self.save_fit(vector, self.state(), meta)

    def save_fit(
        self, vector: np.ndarray | None, state: dict[str, Any], meta: dict[str, str] | None = None
    ) -> None:
        """Store a fit: the vector (None = no vector, e.g. cold start) and the state that goes with it.

        The vector is written first to its own new file, then state.json (naming that file and its
        sha256) replaces the old one, so an interruption at any point leaves a consistent pair.
        """
        new_state = {k: v for k, v in state.items() if k not in _VECTOR_KEYS}
        new_state.setdefault("created_at", self._created_at())
        keep: str | None = None
        if vector is not None:
            data = _vector_bytes(vector, meta)
            sha = hashlib.sha256(data).hexdigest()
            keep = f"vector-{sha[:16]}.safetensors"
            atomic_write_bytes(self.dir / keep, data)
            new_state.update(vector_file=keep, vector_sha256=sha, vector_dim=int(np.asarray(vector).size))
        self._write_state(new_state)
        for stale in self.dir.glob("vector-*.safetensors"):
            if stale.name != keep:
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()

    def _created_at(self) -> str:
        try:
            return str(self.state().get("created_at") or _now())
        except LocalpersError:
            return _now()

    def disk_bytes(self) -> int:
        """Bytes this user takes on disk (all files in the folder)."""
        return sum(p.stat().st_size for p in self.dir.rglob("*") if p.is_file())


class UserStore:
    """The users on this device and which one is active. `root` defaults to `paths.data_dir()`."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else paths.data_dir()
        self.users_dir = self.root / "users"
        self.active_path = self.root / "active.json"

    def _user(self, name: str) -> User:
        return User(name, self.users_dir / name)

    def list(self) -> list[str]:
        """User names, sorted."""
        if not self.users_dir.is_dir():
            return []
        return sorted(
            p.name for p in self.users_dir.iterdir() if p.is_dir() and NAME_PATTERN.fullmatch(p.name)
        )

    def get(self, name: str) -> User:
        user = self._user(validate_name(name))
        if not user.dir.is_dir():
            raise LocalpersError(
                f"no user named {name!r}; `localpers user list` shows the users, "
                f"`localpers user create {name}` makes one"
            )
        return user

    def create(self, name: str) -> User:
        """A new, empty user; it becomes the active user when none is active."""
        validate_name(name)
        if self._user(name).dir.exists():
            raise LocalpersError(f"user {name!r} already exists; pick another name or delete it first")
        staging = self._staging_dir("creating")
        try:
            User(name, staging)._write_state({"created_at": _now()})
            self._commit_staging(staging, name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self._activate_if_none(name)
        return self.get(name)

    def active_name(self) -> str | None:
        """The active user's name; None if none is set or the named user no longer exists."""
        pointer = _read_json_object(
            self.active_path, "run `localpers user use NAME` to choose the active user"
        )
        if pointer is None:
            return None
        name = pointer.get("user")
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise LocalpersError(
                f"{self.active_path} is damaged (bad 'user'); run `localpers user use NAME` to choose the active user"
            )
        return name if self._user(name).dir.is_dir() else None

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
        active = self.active_name()
        if active is None:
            raise LocalpersError("no active user: run `localpers user create NAME`")
        return self.get(active)

    def delete(self, name: str) -> None:
        """Remove the user's folder (history, vector, state) and the active pointer if it names them."""
        user = self.get(name)
        doomed = self._staging_dir("deleting", create=False)
        os.rename(user.dir, doomed)  # the user disappears in one step; the files go next
        try:
            pointer = _read_json_object(self.active_path, "")
        except LocalpersError:
            pointer = {"user": name}  # a damaged pointer may name this user: remove it too
        if pointer is not None and pointer.get("user") == name:
            with contextlib.suppress(FileNotFoundError):
                self.active_path.unlink()
        shutil.rmtree(doomed)
        self._sweep()

    def export(
        self, name: str, dest: Path | str, with_history: bool = False, overwrite: bool = False
    ) -> Path:
        """Write one .zip with the user's state (cluster, fit report) and vector; history only if asked.

        `dest` is the zip's path, or an existing folder to write `localpers-user-<name>.zip` into.
        """
        user = self.get(name)
        user._load_vector()  # refuses a damaged or inconsistent fit before anything is written
        dest = Path(dest)
        if dest.is_dir():
            dest = dest / f"localpers-user-{name}.zip"
        if dest.exists() and not dest.is_file():
            raise LocalpersError(
                f"{dest} exists and is not a regular file (a device, FIFO or socket); it is never replaced:"
                " choose a file path"
            )
        if dest.exists() and not overwrite:
            raise LocalpersError(f"{dest} already exists; choose another path or pass --force")
        members: dict[str, bytes] = {}
        if user.state_path.exists():
            members["state.json"] = user.state_path.read_bytes()
        vector_path = user.vector_path()
        if vector_path is not None:
            members[vector_path.name] = vector_path.read_bytes()
        if with_history and user.history_path.exists():
            user.history()  # validate before exporting
            members["history.jsonl"] = user.history_path.read_bytes()
        manifest = {
            "format": ARCHIVE_FORMAT,
            "format_version": ARCHIVE_VERSION,
            "name": name,
            "exported_at": _now(),
            "cluster": user.state().get("cluster"),
            "with_history": "history.jsonl" in members,
            "files": {member: hashlib.sha256(data).hexdigest() for member, data in members.items()},
        }
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("manifest.json", json.dumps(manifest, indent=2) + "\n")
            for member, data in members.items():
                archive.writestr(member, data)
        if not dest.parent.is_dir():
            raise LocalpersError(f"{dest.parent} is not a folder; create it or choose another path")
        atomic_write_bytes(dest, buffer.getvalue())
        return dest

    def import_(self, archive: Path | str, name: str | None = None) -> User:
        """A new user from an `export` archive, under its own name or `name`; checked before it appears."""
        archive = Path(archive)
        manifest, members = _read_archive(archive)
        if name is None:
            name = manifest.get("name")
            if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
                shown = "missing" if name is None else f"{one_line(repr(name), 40)}, not a valid user name"
                raise InputError(
                    f"{archive}: manifest.json field 'name' is {shown}; import it with --as NAME"
                )
        target = validate_name(name)
        if self._user(target).dir.exists():
            raise LocalpersError(f"user {target!r} already exists; import under another name with --as NAME")
        staging = self._staging_dir("importing")
        try:
            for member, data in members.items():
                (staging / member).write_bytes(data)
            candidate = User(target, staging)
            try:
                candidate._load_vector()
                check_history_size(len(candidate.history()), what=f"{archive} has")
            except LocalpersError as exc:
                detail = str(exc).replace(f"{staging}{os.sep}", "")
                raise InputError(f"{archive} holds a damaged user: {detail}") from None
            self._commit_staging(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self._activate_if_none(target)
        return self.get(target)

    def _staging_dir(self, purpose: str, create: bool = True) -> Path:
        """A hidden folder beside the users (same filesystem, so renames are atomic); list() skips it."""
        self.users_dir.mkdir(parents=True, exist_ok=True)
        self._sweep()
        path = self.users_dir / f".{purpose}-{secrets.token_hex(6)}"
        if create:
            path.mkdir(mode=0o700)
        return path

    def _commit_staging(self, staging: Path, name: str) -> None:
        target = self._user(name).dir
        try:
            os.rename(staging, target)
        except OSError:
            raise LocalpersError(f"user {name!r} already exists; pick another name") from None
        fsync_directory(self.users_dir)

    def _sweep(self) -> None:
        """Remove folders left by an interrupted create, import or delete."""
        for leftover in self.users_dir.glob(".*-*"):
            if leftover.is_dir() and leftover.name.split("-")[0] in (".creating", ".importing", ".deleting"):
                shutil.rmtree(leftover, ignore_errors=True)

    def _activate_if_none(self, name: str) -> None:
        try:
            active = self.active_name()
        except LocalpersError:
            return  # leave a damaged pointer for `user use` to repair, rather than guess
        if active is None:
            self.use(name)


def _read_archive(archive: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(manifest, the other members by name) of a user archive whose files match their recorded sha256.

    Refused before anything is decompressed: a non-regular file, more than MAX_ARCHIVE_MEMBERS
    members, a repeated or unexpected member name, more than one vector, or declared sizes over the
    per-member or total caps. Decompression is capped again at the declared sizes.
    """
    from localpers.users.history import read_regular_file

    raw_archive = read_regular_file(archive, MAX_ARCHIVE_FILE_BYTES, what="user archive (.zip)")
    allowed = {"manifest.json", "state.json", "history.jsonl"}
    try:
        with zipfile.ZipFile(io.BytesIO(raw_archive)) as zipped:
            infos = zipped.infolist()
            if len(infos) > MAX_ARCHIVE_MEMBERS:
                raise InputError(
                    f"{archive}: {len(infos)} members, more than the {MAX_ARCHIVE_MEMBERS} of a user archive;"
                    " not a localpers user archive"
                )
            names = [info.filename for info in infos]
            for info in infos:
                shown = one_line(repr(info.filename), 80)
                if info.filename not in allowed and not VECTOR_FILE_PATTERN.fullmatch(info.filename):
                    raise InputError(f"{archive}: unexpected file {shown}; not a localpers user archive")
                if names.count(info.filename) > 1:
                    raise InputError(f"{archive}: member {shown} appears twice; not a localpers user archive")
                if info.file_size > MAX_ARCHIVE_MEMBER_BYTES:
                    raise InputError(f"{archive}: {info.filename} is too large for a user archive")
            if sum(1 for n in names if VECTOR_FILE_PATTERN.fullmatch(n)) > 1:
                raise InputError(f"{archive}: more than one vector file; not a localpers user archive")
            declared = sum(info.file_size for info in infos)
            if declared > MAX_ARCHIVE_TOTAL_BYTES:
                raise InputError(
                    f"{archive}: its members unpack to {declared} bytes, more than the"
                    f" {MAX_ARCHIVE_TOTAL_BYTES} of a user archive"
                )
            raw: dict[str, bytes] = {}
            for info in infos:
                with zipped.open(info) as member:
                    data = member.read(info.file_size + 1)
                if len(data) != info.file_size:
                    raise InputError(f"{archive}: {info.filename} is not the size the archive declares")
                raw[info.filename] = data
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        OSError,
        EOFError,
        NotImplementedError,
        ValueError,
    ) as exc:
        reason = one_line(str(exc), 120)
        raise InputError(f"{archive} is not a localpers user archive ({reason})") from None
    if "manifest.json" not in raw:
        raise InputError(f"{archive} has no manifest.json; not a localpers user archive")
    try:
        manifest = parse_json(raw["manifest.json"])
    except JSONProblem as exc:
        raise InputError(f"{archive}: manifest.json is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != ARCHIVE_FORMAT:
        raise InputError(f"{archive} is not a localpers user archive (manifest.json field 'format')")
    if manifest.get("format_version") != ARCHIVE_VERSION:
        shown = one_line(repr(manifest.get("format_version")), 40)
        raise InputError(
            f"{archive}: manifest.json field 'format_version' is {shown}; this localpers reads "
            f"version {ARCHIVE_VERSION}: upgrade localpers"
        )
    listed = manifest.get("files")
    if not isinstance(listed, dict) or set(listed) != set(raw) - {"manifest.json"}:
        raise InputError(f"{archive}: manifest.json field 'files' does not list the archive's files")
    for member, expected in listed.items():
        if hashlib.sha256(raw[member]).hexdigest() != expected:
            raise InputError(f"{archive}: {member} does not match its sha256 in manifest.json (damaged)")
    del raw["manifest.json"]
    return manifest, raw


def history_for(user: User, history_limit: int | None, method: str) -> list[HistoryItem]:
    """The user's history (the `history_limit` most recent items), refusing an empty one for `method`."""
    items = user.history()
    if history_limit is not None:
        items = items[-history_limit:]
    if not items:
        raise LocalpersError(
            f"user {user.name!r} has no history: {method} learns from it; add items with `localpers history import`"
        )
    return items


def _state_json(state: dict[str, Any]) -> str:
    """One top-level field per line, each value compact: readable, and the token bias stays a few KB."""

    def compact(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))

    return "{\n" + ",\n".join(f"  {compact(key)}: {compact(value)}" for key, value in state.items()) + "\n}"
