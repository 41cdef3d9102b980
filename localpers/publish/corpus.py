"""Read and validate a publisher corpus: JSONL, one user per line.

Each line is `{"user_id": str, "history": [{"input": str, "output": str, ...}, ...], ...}`, the format of
the shared news-headlines data. Extra fields (ids, dates, categories, `queries`) are ignored; `queries`
are never read, so a corpus file holds only what may be trained on. Every problem is reported as a
one-line `InputError` (exit code 2) naming the file, the line and the field. This module does not embed,
cluster or split anything.
"""

from __future__ import annotations

import codecs
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from localpers.errors import InputError
from localpers.untrusted import JSONProblem, parse_json, reject_duplicate_keys


@dataclass(frozen=True)
class HistoryItem:
    """One (input, output) example written by a user."""

    input: str
    output: str
    date: str | None = None  # ISO date when the corpus has one; orders "earlier" items for history prompts


@dataclass(frozen=True)
class CorpusUser:
    """A training user and their history, in file order."""

    user_id: str
    history: tuple[HistoryItem, ...]
    line: int


@dataclass(frozen=True)
class Corpus:
    """Validated users of one corpus file, and the SHA-256 of the very bytes they were parsed from ("" for a
    corpus built in memory): what the stage keys hash, and what a task that reads the file again must find."""

    path: Path
    users: tuple[CorpusUser, ...]
    sha256: str = ""

    @property
    def n_items(self) -> int:
        return sum(len(user.history) for user in self.users)


def _string_field(value: Any, where: str, field_name: str) -> str:
    if not isinstance(value, str):
        raise InputError(f"{where}: field {field_name!r} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InputError(f"{where}: field {field_name!r} is empty; remove the item or fill it in")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(
            f"{where}: field {field_name!r} is not Unicode text (a lone surrogate \\u{ord(value[exc.start]):04x},"
            " half of a \\u escape pair); fix the line"
        ) from None
    return value


def parse_user(record: Any, where: str, line: int) -> CorpusUser:
    """Validate one decoded JSON line; `where` is `file:line` for the error messages."""
    if not isinstance(record, dict):
        raise InputError(f"{where}: expected a JSON object per line, got {type(record).__name__}")
    if "user_id" not in record:
        raise InputError(f"{where}: missing field 'user_id'")
    user_id = record["user_id"]
    if isinstance(user_id, int) and not isinstance(user_id, bool):
        user_id = str(user_id)
    user_id = _string_field(user_id, where, "user_id")
    history = record.get("history")
    if history is None:
        raise InputError(f"{where}: user {user_id!r} has no 'history' field")
    if not isinstance(history, list):
        raise InputError(f"{where}: field 'history' must be a list, got {type(history).__name__}")
    if not history:
        raise InputError(f"{where}: user {user_id!r} has an empty history; drop the user or add items")
    items = []
    for index, item in enumerate(history):
        item_where = f"{where}: history[{index}]"
        if not isinstance(item, dict):
            raise InputError(f"{item_where} must be an object with 'input' and 'output'")
        for key in ("input", "output"):
            if key not in item:
                raise InputError(f"{item_where}: missing field {key!r}")
        items.append(
            HistoryItem(
                input=_string_field(item["input"], item_where, "input"),
                output=_string_field(item["output"], item_where, "output").strip(),
                date=item["date"] if isinstance(item.get("date"), str) else None,
            )
        )
    return CorpusUser(user_id=user_id, history=tuple(items), line=line)


_LINE_END = re.compile(rb"\r\n|\r|\n")  # where text mode ends a line
_READ_SIZE = 1 << 20


def _lines(handle: BinaryIO, digest: Any) -> Iterator[bytes]:
    """The file's lines as bytes (without their ends, which are \\n, \\r\\n or a lone \\r, as text mode reads them),
    read a megabyte at a time, every byte also given to `digest`: one pass, and never the whole file in memory (a
    copy of it per Ray worker). Each piece is searched once, so a line of many megabytes costs what it reads."""
    partial: list[bytes] = []  # the start of a line the pieces read so far have not ended
    carry = b""  # a CR that ended a piece: half of a CRLF, or a line end of its own
    while chunk := handle.read(_READ_SIZE):
        digest.update(chunk)
        chunk, carry = carry + chunk, b""
        if chunk.endswith(b"\r"):
            chunk, carry = chunk[:-1], b"\r"
        parts = _LINE_END.split(chunk)
        partial.append(parts[0])
        if len(parts) > 1:
            yield b"".join(partial)
            yield from parts[1:-1]
            partial = [parts[-1]]
    rest = b"".join(partial)
    if carry or rest:  # a last line, ended by a CR or by the end of the file
        yield rest


def load_corpus(path: str | Path, *, min_users: int = 1) -> Corpus:
    """Read and validate a JSONL corpus; blank lines are skipped, user ids must be unique."""
    corpus_path = Path(path)
    if not corpus_path.is_file():
        if corpus_path.is_dir():
            what = "is a directory"
        elif corpus_path.exists():
            what = "is not a regular file (a device, FIFO or socket)"
        else:
            what = "does not exist"
        raise InputError(f"corpus file {corpus_path} {what}; give a JSONL file, one user per line")
    # Hashed and parsed from the same bytes in one pass: hashing the file again after the parse would key the
    # stages by whatever the file held by then (an edit during the parse went unnoticed).
    digest = hashlib.sha256()
    users: list[CorpusUser] = []
    first_line: dict[str, int] = {}
    with corpus_path.open("rb") as handle:
        for number, raw_bytes in enumerate(_lines(handle, digest), start=1):
            if number == 1 and raw_bytes.startswith(codecs.BOM_UTF8):  # an editor's BOM, not data
                raw_bytes = raw_bytes[len(codecs.BOM_UTF8) :]
            where = f"{corpus_path}:{number}"
            try:
                raw = raw_bytes.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(
                    f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start + 1} of the line); re-encode the file"
                ) from None
            if not raw.strip():
                continue
            try:
                # a key named twice would keep its last value silently (or blame another line's user_id)
                record = parse_json(raw, object_pairs_hook=reject_duplicate_keys)
            except JSONProblem as problem:
                raise InputError(f"{where}: not valid JSON ({problem})") from None
            user = parse_user(record, where, number)
            if user.user_id in first_line:
                raise InputError(
                    f"{where}: user_id {user.user_id!r} already appears on line {first_line[user.user_id]}"
                )
            first_line[user.user_id] = number
            users.append(user)
    if len(users) < min_users:
        fix = "add users" + (" or lower --k" if min_users > 2 else "")  # two users is the least any --k needs
        raise InputError(f"{corpus_path}: {len(users)} user(s) found, at least {min_users} needed; {fix}")
    return Corpus(path=corpus_path, users=tuple(users), sha256=digest.hexdigest())
