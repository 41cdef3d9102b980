"""Benchmark users from a shared-data JSONL file: each user's history (to fit on) and queries (to score).

Format, one user per line (see `../shared/data/news-headlines/README.md`):

    {"user_id": "u003", "history": [{"id", "input", "output", ...}, ...], "queries": [{"id", "input", "output", ...}]}

History items become `HistoryItem`s (normalised text); queries keep their `id`, `input` and reference
`output`. The shared data holds each history oldest first and every query later than its author's history;
a file from elsewhere may not, so `read_bench_file` repairs what would make a run wrong without a word and
says so in `BenchFile.notes` (printed, and kept in results.json and report.md): a history whose items all carry
ISO dates but are out of order is sorted by them (stably); a history item equal to one of its author's queries
is left out of the history (a method must not be fitted on the answer); duplicate history items are dropped; a
user without queries is left out (with `dev_split` that is an author too short to split; the split itself is
`localpers.bench.dev_split`'s). Queries dated before their author's latest history item are counted, not
changed, and so are references with no word ROUGE can count (`metrics.scorable`). Every error is an
`InputError` (exit 2) naming the file, the line and the field: a line that is not JSON or names a key twice, a
field of the wrong type, text that is not Unicode (a lone surrogate escape). Lines end at "\n" only, as in a
history import. This module only reads; it scores nothing.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localpers.bench.dev_split import DEV_MIN_QUERIES, split_for_dev
from localpers.bench.metrics import scorable
from localpers.errors import InputError, LocalpersError
from localpers.tasks import TASKS
from localpers.untrusted import JSONProblem, parse_json, reject_duplicate_keys
from localpers.users.dates import item_date, oldest_first
from localpers.users.history import DEFAULT_TASK, HistoryItem, normalize_text

_UNSAFE_NAME = re.compile(r"[^a-z0-9_-]+")
STORE_NAME_CHARS = 32


@dataclass(frozen=True)
class BenchQuery:
    """One held-out article: generate for `input`, compare with the author's `reference`."""

    id: str
    input: str
    reference: str


@dataclass(frozen=True)
class BenchUser:
    """One author: `history` oldest first (what the device may fit on) and the held-out `queries`."""

    user_id: str
    history: tuple[HistoryItem, ...]
    queries: tuple[BenchQuery, ...]
    line: int = 0  # the user's line in the file (0 when not read from one)

    @property
    def store_name(self) -> str:
        """A name the user store accepts, e.g. "u003" -> "u003", "U 003!" -> "u-003-ae3e57fd"."""
        return store_name(self.user_id)

    def history_up_to(self, limit: int | None) -> tuple[HistoryItem, ...]:
        """The `limit` most recent history items (all of them for None)."""
        if limit is None:
            return self.history
        return self.history[-limit:] if limit > 0 else ()


def store_name(user_id: str) -> str:
    """A valid, stable user-store name for any user id: lowercase, [a-z0-9_-], at most 32 characters.

    An id that is such a name already is kept; any other gets what is left of it after cleaning, cut short,
    and 8 hex digits of its sha256, so that distinct ids ("李明", "王芳"; two long ids alike in their first 32
    characters) get distinct names.
    """
    cleaned = _UNSAFE_NAME.sub("-", user_id.lower()).strip("-_")
    if cleaned == user_id and len(cleaned) <= STORE_NAME_CHARS:
        return cleaned
    digest = hashlib.sha256(user_id.encode("utf-8")).hexdigest()[:8]
    stem = cleaned[: STORE_NAME_CHARS - len(digest) - 1].strip("-_")
    return f"{stem}-{digest}" if stem else f"user-{digest}"


@dataclass
class BenchFile:
    """The users of a file, and one line for each way the run reads the file differently from how it is written."""

    users: list[BenchUser]
    notes: list[str] = field(default_factory=list)


@dataclass
class _Repairs:
    """What reading one file changed or found, user ids per kind (turned into `BenchFile.notes`)."""

    resorted: list[str] = field(default_factory=list)
    leaked: dict[str, int] = field(default_factory=dict)  # history items equal to one of the user's queries
    duplicates: dict[str, int] = field(default_factory=dict)
    early_queries: dict[str, int] = field(default_factory=dict)
    # history items holding one of the author's query headlines exactly, for another article (kept)
    repeated_answers: dict[str, int] = field(default_factory=dict)
    without_queries: list[str] = field(default_factory=list)
    unscorable: dict[str, int] = field(default_factory=dict)  # references ROUGE cannot count a word of
    queries: int = 0  # read, in all

    def notes(self, dev_split: bool) -> list[str]:
        notes = []
        if self.resorted:
            notes.append(
                f"the history of {_users(self.resorted)} was not oldest first: sorted by its items' dates"
            )
        if self.leaked:
            notes.append(
                f"{sum(self.leaked.values())} history item(s) equal to one of their author's queries left out "
                f"of the history, so no method is fitted on the answer ({_users(list(self.leaked))})"
            )
        if self.repeated_answers:
            notes.append(
                f"{sum(self.repeated_answers.values())} history item(s) hold one of their author's query headlines"
                f" word for word, written for another article ({_users(list(self.repeated_answers))}): kept, as an"
                " author may repeat a headline; where a file's history is not all older than its queries, that"
                " is the answer in the prompt"
            )
        if self.duplicates:
            notes.append(
                f"{sum(self.duplicates.values())} duplicate history item(s) dropped ({_users(list(self.duplicates))})"
            )
        if self.early_queries:
            notes.append(
                f"{sum(self.early_queries.values())} query(ies) dated before their author's latest history item "
                f"({_users(list(self.early_queries))}): the format expects queries after the history"
            )
        if self.unscorable:
            notes.append(
                f"{sum(self.unscorable.values())} of {self.queries} references have no word ROUGE can count "
                f"(rouge-score keeps only a-z and 0-9), so every method scores 0 on them "
                f"({_users(list(self.unscorable))})"
            )
        if self.without_queries:
            why = (
                "too short for the dev split (5 queries and 1 history item)"
                if dev_split
                else "without queries"
            )
            notes.append(
                f"{len(self.without_queries)} user(s) {why} left out ({_users(self.without_queries)})"
            )
        return notes


def _users(user_ids: list[str], shown: int = 5) -> str:
    named = ", ".join(user_ids[:shown])
    more = f" and {len(user_ids) - shown} more" if len(user_ids) > shown else ""
    return f"user {named}{more}" if len(user_ids) == 1 else f"users {named}{more}"


def check_data_path(path: Path) -> None:
    """Refuse a --data path that is not a file, before anything else is done."""
    if path.is_dir():
        raise InputError(f"{path}: is a directory; pass the users' JSONL file with --data")
    if not path.is_file():
        raise InputError(f"{path}: no such file; pass the users' JSONL with --data")


def load_bench_users(
    path: Path | str,
    *,
    max_users: int | None = None,
    max_queries: int | None = None,
    task: str = DEFAULT_TASK,
    dev_split: bool = False,
) -> list[BenchUser]:
    """The users of `path` (`read_bench_file`'s, without its notes)."""
    return read_bench_file(
        path, max_users=max_users, max_queries=max_queries, task=task, dev_split=dev_split
    ).users


def read_bench_file(
    path: Path | str,
    *,
    max_users: int | None = None,
    max_queries: int | None = None,
    task: str = DEFAULT_TASK,
    dev_split: bool = False,
) -> BenchFile:
    """The users of `path` in file order, each with at most `max_queries` queries (first ones).

    With `dev_split` (for train authors, whose file holds only histories), each author's history is split as
    the test file was made: the most recent 30% (at least 5, at most 40) become the queries, and up to 100
    items before them the history; an author too short for 5 queries and one history item is left out.
    Settings are chosen on this split, never on the test file's queries.
    """
    path = Path(path)
    check_data_path(path)
    try:
        # Lines end at "\n" only: str.splitlines would also split inside a JSON string at U+2028 or \x85.
        lines = path.read_text(encoding="utf-8-sig").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read ({exc})") from None
    users: list[BenchUser] = []
    repairs = _Repairs()
    seen: dict[str, int] = {}
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = parse_json(line, object_pairs_hook=reject_duplicate_keys)  # which 'user_id' was meant?
        except JSONProblem as exc:
            raise InputError(f"{path} line {line_number}: not valid JSON ({exc})") from None
        user = _user_from_record(path, line_number, record, task, max_queries, dev_split, repairs)
        if user is None:
            continue
        if user.store_name in seen:
            raise InputError(
                f"{path} line {line_number}: user_id {user.user_id!r} collides with line "
                f"{seen[user.store_name]} (the same id, or the same name once made file-safe); give users "
                "distinct ids"
            )
        seen[user.store_name] = line_number
        users.append(user)
        if max_users is not None and len(users) >= max_users:
            break
    if not users:
        if repairs.without_queries and not dev_split:
            raise InputError(
                f"{path}: no user has queries; for a file of histories only (like train.jsonl) add --dev-split"
            )
        if repairs.without_queries:
            raise InputError(
                f"{path}: every author is too short for the dev split ({DEV_MIN_QUERIES} queries and 1 history"
                f" item at least): {_users(repairs.without_queries)}"
            )
        raise InputError(f"{path} holds no users; expected JSONL lines with user_id, history, queries")
    return BenchFile(users, repairs.notes(dev_split))


def _user_from_record(
    path: Path,
    line_number: int,
    record: Any,
    task: str,
    max_queries: int | None,
    dev_split: bool,
    repairs: _Repairs,
) -> BenchUser | None:
    where = f"{path} line {line_number}"
    if not isinstance(record, dict):
        raise InputError(f"{where}: expected a JSON object with user_id, history and queries")
    if not record.keys() & {"user_id", "history", "queries"} and record.keys() & {"input", "output"}:
        # a line of the file `history import` takes: a user's own items, with no author to fit or query to score
        expected = (
            "one line per author with user_id and history, e.g. ../shared/data/news-headlines/train.jsonl"
            if dev_split
            else "one line per user with user_id, history and queries, e.g. ../shared/data/news-headlines/test.jsonl"
        )
        raise InputError(
            f"{where}: this looks like a history file (items with input and output, as `localpers history import`"
            f" takes), not benchmark users; --data takes {expected}"
        )
    user_id = record.get("user_id")
    if isinstance(user_id, int) and not isinstance(user_id, bool):
        user_id = str(user_id)  # numbered authors, as `localpers publish` reads them
    if not isinstance(user_id, str) or not user_id.strip():
        raise InputError(f"{where}: field 'user_id' must be a non-empty string or an integer")
    _check_unicode(user_id, f"{where}: field 'user_id'")
    history_records = record.get("history", [])
    query_records = record.get("queries")
    if not isinstance(history_records, list):
        raise InputError(f"{where} (user {user_id}): field 'history' must be a list")
    if query_records is not None and not isinstance(query_records, list):
        raise InputError(f"{where} (user {user_id}): field 'queries' must be a list")
    if dev_split and query_records:
        # the split would move these queries into histories and score them as a "dev" split: tuning on test queries
        raise InputError(
            f"{where} (user {user_id}): holds queries, so this is a file of held-out authors; --dev-split splits"
            " train authors' histories (e.g. train.jsonl): drop --dev-split here, and choose settings on train.jsonl"
        )
    if dev_split:
        split = split_for_dev([*history_records, *(query_records or [])])
        if split.repeats:
            repairs.duplicates[user_id] = split.repeats
        history_records, query_records, resorted = split.history, split.queries, split.resorted
    else:
        history_records, resorted = oldest_first(history_records)
    if resorted:
        repairs.resorted.append(user_id)
    if not query_records:
        repairs.without_queries.append(user_id)
        return None

    query_records = query_records[:max_queries] if max_queries else query_records
    queries: list[BenchQuery] = []
    query_ids: set[str] = set()
    for index, entry in enumerate(query_records, start=1):
        text = _fields(entry, f"{where} (user {user_id}) query {index}", task)
        query_id = text["id"] or f"q{index}"
        if query_id in query_ids:
            raise InputError(f"{where} (user {user_id}) query {index}: duplicate id {query_id!r}")
        query_ids.add(query_id)
        queries.append(BenchQuery(query_id, normalize_text(text["input"]), normalize_text(text["output"])))
    answers = {HistoryItem.create(task, query.input, query.reference).id for query in queries}
    headlines = {query.reference for query in queries}
    repairs.queries += len(queries)
    unscorable = sum(1 for query in queries if not scorable(query.reference))
    if unscorable:
        repairs.unscorable[user_id] = unscorable

    history: list[HistoryItem] = []
    known: set[str] = set()
    for index, entry in enumerate(history_records, start=1):
        text = _fields(entry, f"{where} (user {user_id}) history item {index}", task)
        item = HistoryItem.create(task, text["input"], text["output"], source=text["id"])
        if item.id in answers:
            repairs.leaked[user_id] = repairs.leaked.get(user_id, 0) + 1
            continue
        if item.id in known:
            repairs.duplicates[user_id] = repairs.duplicates.get(user_id, 0) + 1
            continue
        if normalize_text(text["output"]) in headlines:
            repairs.repeated_answers[user_id] = repairs.repeated_answers.get(user_id, 0) + 1
        known.add(item.id)
        history.append(item)

    latest = max((item_date(entry) or "" for entry in history_records), default="")
    early = sum(1 for entry in query_records if (date := item_date(entry)) and latest and date < latest)
    if early:
        repairs.early_queries[user_id] = early
    return BenchUser(user_id, tuple(history), tuple(queries), line_number)


def _fields(entry: Any, where: str, task: str = DEFAULT_TASK) -> dict[str, str]:
    """`input` (with an article after the task's instruction), `output` (non-empty, no longer than the task
    writes) and `id` ("" when absent) of one item."""
    if not isinstance(entry, dict):
        raise InputError(f"{where}: expected a JSON object with 'input' and 'output'")
    out: dict[str, str] = {}
    for name in ("input", "output"):
        value = entry.get(name)
        if not isinstance(value, str) or not normalize_text(value):
            raise InputError(f"{where}: field {name!r} must be a non-empty string")
        _check_unicode(value, f"{where}: field {name!r}")
        out[name] = value
    if not TASKS[task].content(normalize_text(out["input"])):
        raise InputError(f"{where}: field 'input' holds the instruction but no text after it")
    try:
        TASKS[task].check_output(normalize_text(out["output"]), "field 'output'")
    except LocalpersError as exc:
        raise InputError(f"{where}: {exc}") from None
    item_id = entry.get("id", "")
    if not isinstance(item_id, str | int):
        raise InputError(f"{where}: field 'id' must be a string")
    out["id"] = str(item_id)
    _check_unicode(out["id"], f"{where}: field 'id'")
    return out


def _check_unicode(value: str, what: str) -> None:
    """Refuse a string holding a lone surrogate (JSON's "\\ud800"): nothing can store or print it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(
            f"{what} is not Unicode text (a lone surrogate \\u{ord(value[exc.start]):04x} at character "
            f"{exc.start}); write characters, not half of a \\u escape pair"
        ) from None
