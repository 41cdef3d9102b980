"""A user's writing history: its items, their ids and normalisation, limits, and the stored history.jsonl.

A `HistoryItem` is one (task, input, output) example of the user's own writing; its `id` is a short
hash of those three fields, so the same text always gets the same id. `read_stored_history` and
`serialize_history` read and write a user's history.jsonl (one item object per line); `read_json_lines` and
`item_from_record` are the line reader and item check it shares with `localpers.users.history_import`, which
reads the files a user imports. Errors name the file and line ("history.jsonl line 7: missing field 'output'").
This module neither stores nor fits anything: `localpers.users.store` keeps the items per user.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from localpers.errors import InputError, LocalpersError
from localpers.regular_files import read_regular_file
from localpers.tasks import TASKS
from localpers.untrusted import JSONProblem, parse_json, reject_duplicate_keys

MAX_HISTORY_ITEMS = 500
TUI_SOURCE = "tui"  # the `source` of an output accepted in the TUI
MAX_HISTORY_FILE_BYTES = 64 << 20  # 500 items of long articles fit many times over
# A history item's input as stored: far more than any prompt reads (tasks.py's max_input_chars), far less than
# what would let 500 items outgrow MAX_HISTORY_FILE_BYTES's 64 MiB in ASCII.
MAX_STORED_INPUT_CHARS = 100_000
DEFAULT_TASK = "headline"
ID_LENGTH = 12

_HORIZONTAL_SPACE = re.compile(r"[^\S\n]+")
_MANY_NEWLINES = re.compile(r"\n{3,}")
# C0 and C1 control characters other than tab and newline (ESC starts terminal escape sequences), and
# the Unicode line and paragraph separators: never part of anyone's writing, removed on import.
CONTROL_CHARACTERS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


@dataclass(frozen=True)
class HistoryItem:
    """One example of the user's writing: `output` is what the user wrote for `input`."""

    id: str
    task: str
    input: str
    output: str
    source: str | None = None

    @classmethod
    def create(
        cls, task: str, input: str, output: str, source: str | None = None, *, strict: bool = False
    ) -> HistoryItem:
        """An item with normalised text and its stable id; raises ValueError on empty text or unknown task.

        `strict` (a new item: import, `history add`, the TUI's accept) also refuses what the task's
        prompts cannot carry whole (`Task.check_text`, `Task.check_output`); stored items are read as
        they are.
        """
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; choose one of: {', '.join(TASKS)}")
        _check_unicode(input, "field 'input'")
        _check_unicode(output, "field 'output'")
        clean_input = normalize_text(input)
        clean_output = normalize_text(output)
        if not clean_input:
            raise ValueError("field 'input' is empty")
        if not clean_output:
            raise ValueError("field 'output' is empty")
        if strict:
            for text, field in ((clean_input, "input"), (clean_output, "output")):
                if not any(ch.isprintable() and not ch.isspace() for ch in text):  # as `rewrite` calls empty
                    raise ValueError(f"field {field!r} holds only invisible characters")
            if TASKS[task].one_line:  # a headline's line break is one the model can never write: a space
                clean_output = " ".join(line.strip() for line in clean_output.splitlines() if line.strip())
            if len(clean_input) > MAX_STORED_INPUT_CHARS:
                raise ValueError(
                    f"field 'input' has {len(clean_input):,} characters; a history item holds at most"
                    f" {MAX_STORED_INPUT_CHARS:,} (a {task} prompt reads the first"
                    f" {TASKS[task].max_input_chars:,}): keep the text's start"
                )
            try:
                TASKS[task].check_text(
                    clean_input,
                    "field 'input'",
                    advice=f"split it into items of at most {TASKS[task].max_input_chars:,} characters",
                )
                TASKS[task].check_output(clean_output, "field 'output'")
            except InputError as exc:
                raise ValueError(str(exc)) from None
        return cls(item_id(task, clean_input, clean_output), task, clean_input, clean_output, source)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def history_digest(items: Iterable[HistoryItem]) -> str:
    """A short sha256 of the items' ids in order: equal digests mean the same history (a fit records it)."""
    return hashlib.sha256("\n".join(item.id for item in items).encode("ascii")).hexdigest()[:16]


def fitted_on_this_history(stored_fit: object, history: list[HistoryItem]) -> bool:
    """Whether a stored fit (state.json's `fit`, or cope.json) recorded the digest of `history` as it is now: a
    refit would learn from the same items. False for a fit that recorded none (made before fits did)."""
    digest = stored_fit.get("history_sha256") if isinstance(stored_fit, dict) else None
    return isinstance(digest, str) and digest == history_digest(history)


def _check_unicode(text: str, what: str) -> None:
    """A ValueError naming `what` if `text` holds a lone surrogate: JSON's "\\ud800" escape, or bytes that were
    not UTF-8 (Python keeps those as surrogates), which nothing can encode to store or tokenize."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{what} is not Unicode text (a lone surrogate \\u{ord(text[exc.start]):04x} at character"
            f" {exc.start}); save the text as UTF-8 (e.g. iconv -f latin1 -t utf-8) and write characters,"
            " not half of a \\u escape pair"
        ) from None


def item_id(task: str, input: str, output: str) -> str:
    """Short sha256 of the three fields, e.g. item_id("headline", "a", "b") -> 12 hex characters."""
    encoded = json.dumps([task, input, output], ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(encoded).hexdigest()[:ID_LENGTH]


def normalize_text(text: str) -> str:
    """NFC, unix newlines, runs of spaces/tabs -> one space, no trailing spaces, at most one blank line,
    control characters (terminal escapes, NUL) and Unicode line separators removed.

    normalize_text("  Big   news\\r\\n ") -> "Big news"
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = CONTROL_CHARACTERS.sub("", text)
    lines = [_HORIZONTAL_SPACE.sub(" ", line).strip() for line in text.split("\n")]
    # NFC last: a control character removed after it could leave a letter and its accent side by side, which
    # the next normalization (reading the stored item back) would compose, giving the item another id
    return unicodedata.normalize("NFC", _MANY_NEWLINES.sub("\n\n", "\n".join(lines)).strip())


def printable_name(path: Path) -> str:
    """`path`'s file name as text that can be stored: bytes of a name that are not UTF-8 (kept by Python as lone
    surrogates, which no file can hold) become U+FFFD."""
    return os.fsencode(path.name).decode("utf-8", "replace")


def check_history_size(count: int, *, what: str, hint: str = "") -> None:
    """Refuse more than MAX_HISTORY_ITEMS items; `what` starts the message, e.g. "user 'ann' would have"."""
    if count > MAX_HISTORY_ITEMS:
        raise InputError(
            f"{what} {count} history items, more than the limit of {MAX_HISTORY_ITEMS}; "
            f"keep your {MAX_HISTORY_ITEMS} most representative items (recent ones are a good choice)"
            + (f", {hint}" if hint else "")
        )


def check_history_bytes(size: int, items: Sequence[HistoryItem], *, what: str) -> None:
    """Refuse to store a history of `size` bytes that reading it back would refuse (MAX_HISTORY_FILE_BYTES):
    the user would be locked out of every command, `history remove` included. Names the longest item."""
    if size <= MAX_HISTORY_FILE_BYTES:
        return
    longest = max(items, key=lambda item: len(item.input))
    raise InputError(
        f"the history of {what} would be {size:,} bytes, more than the {MAX_HISTORY_FILE_BYTES:,} a history may"
        f" hold; nothing was written: import shorter texts (the longest, item {longest.id}, has"
        f" {len(longest.input):,} characters of input; a {longest.task} prompt reads at most"
        f" {TASKS[longest.task].max_input_chars:,})"
    )


def merge_history(
    existing: Iterable[HistoryItem], new: Iterable[HistoryItem]
) -> tuple[list[HistoryItem], list[HistoryItem]]:
    """(existing + the new items not already present, the new items skipped as already present)."""
    merged = list(existing)
    known = {item.id for item in merged}
    skipped: list[HistoryItem] = []
    for item in new:
        if item.id in known:
            skipped.append(item)
        else:
            known.add(item.id)
            merged.append(item)
    return merged, skipped


def read_stored_history(path: Path) -> list[HistoryItem]:
    """A user's stored history.jsonl (one item object per line); a missing file is an empty history, a link to
    nothing is refused (read as empty, the next save would replace the link and part the history from it).

    An item is read once, where it first appears: localpers never stores one twice, but a file edited or joined
    by hand can hold a line twice, and so can one written before control characters were removed on import (two
    lines that differ only by them read back as one item). Counted twice, such an item was a "series" the user
    repeats, two training pairs, a held-out item that was also trained on, and the oldest item and the newest.
    """
    if not path.exists():
        refuse_dangling_link(path)
        return []
    hint = "fix or delete that line, or remove the file"
    items: dict[str, HistoryItem] = {}
    for line_number, record in read_json_lines(path, hint=hint, stored=True):
        where = f"line {line_number}"
        source = record.get("source")
        if source is not None and not isinstance(source, str):
            raise InputError(f"{path} {where}: field 'source' must be a string; {hint}")
        item = item_from_record(path, where, record, DEFAULT_TASK, source, hint=hint)
        items.setdefault(item.id, item)
    return list(items.values())


def refuse_dangling_link(path: Path) -> None:
    """A one-line error if `path` is a symbolic link whose target does not exist (an unmounted drive)."""
    if path.is_symlink() and not path.exists():
        raise LocalpersError(
            f"{path} is a link to {os.readlink(path)}, which does not exist; reconnect what it points to, or"
            " remove the link to start an empty history"
        )


def serialize_history(items: Iterable[HistoryItem]) -> str:
    """JSONL text of the items, one object per line (the stored history.jsonl format)."""
    return "".join(json.dumps(item.to_json(), ensure_ascii=False) + "\n" for item in items)


def demo_history_path() -> Path:
    """The shipped demo user's history: `localpers.models` when installed, `models/` in a checkout."""
    from importlib import resources

    try:
        installed = Path(str(resources.files("localpers.models") / "demo-user" / "history.jsonl"))
        if installed.is_file():
            return installed
    except ModuleNotFoundError:
        pass
    checkout = Path(__file__).resolve().parents[2] / "models" / "demo-user" / "history.jsonl"
    if checkout.is_file():
        return checkout
    raise LocalpersError("the demo history is missing from this installation; reinstall localpers")


def read_json_lines(
    path: Path, hint: str = "fix that line", *, stored: bool = False, data: bytes | None = None
) -> Iterable[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line; one-line errors for unreadable files and bad lines."""
    if data is not None and len(data) > MAX_HISTORY_FILE_BYTES:
        raise InputError(
            f"{path} holds more than the {MAX_HISTORY_FILE_BYTES:,} bytes a history file may have; split it"
        )
    raw = (
        data
        if data is not None
        else read_regular_file(path, MAX_HISTORY_FILE_BYTES, what="history file", stored=stored)
    )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line_number = raw[: exc.start].count(b"\n") + 1
        raise InputError(f"{path} line {line_number}: not UTF-8 text; save the file as UTF-8") from None
    # Lines end at "\n" only: str.splitlines would also split inside a JSON string at U+2028 or \x1c.
    for line_number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = parse_json(line, object_pairs_hook=reject_duplicate_keys)  # which 'input' was meant?
        except JSONProblem as exc:
            if line.strip() in ("[", "{"):  # the first line of a pretty-printed JSON document
                # an object is most likely `history list --json`'s, whose items are under "items"
                items = ".[]" if line.strip() == "[" else ".items[]"
                hint = (
                    "this file looks like one JSON document, but a history file is JSONL: one object per line"
                    f" (e.g. `jq -c '{items}' FILE > items.jsonl`)"
                )
            raise InputError(f"{path} line {line_number}: not valid JSON ({exc}); {hint}") from None
        if not isinstance(record, dict):
            raise InputError(
                f"{path} line {line_number}: expected a JSON object, got {type(record).__name__}; {hint}"
            )
        yield line_number, record


def item_from_record(
    path: Path,
    where: str,
    record: Any,
    default_task: str,
    source: str | None,
    *,
    hint: str | None = None,
    strict: bool = False,
) -> HistoryItem:
    """One record as an item (`strict`: `HistoryItem.create`'s); every error names the file and the line."""
    prefix = f"{path} {where}"
    suffix = f"; {hint}" if hint else ""
    if not isinstance(record, dict):
        raise InputError(f"{prefix}: expected a JSON object with 'input' and 'output'{suffix}")
    for name in ("input", "output"):
        if name not in record:
            raise InputError(f"{prefix}: missing field {name!r}{suffix}")
        if not isinstance(record[name], str):
            raise InputError(f"{prefix}: field {name!r} must be a string{suffix}")
    task = record.get("task", default_task)
    if not isinstance(task, str):
        raise InputError(f"{prefix}: field 'task' must be a string{suffix}")
    try:
        return HistoryItem.create(task, record["input"], record["output"], source, strict=strict)
    except ValueError as exc:
        raise InputError(f"{prefix}: {exc}{suffix}") from None
