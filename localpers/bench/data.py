"""Benchmark users from a shared-data JSONL file: each user's history (to fit on) and queries (to score).

Format, one user per line (see `../shared/data/news-headlines/README.md`):

    {"user_id": "u003", "history": [{"id", "input", "output", ...}, ...], "queries": [{"id", "input", "output", ...}]}

History items become `HistoryItem`s (normalised text, duplicates dropped, file order kept, which the
shared data guarantees is oldest first); queries keep their `id`, `input` and reference `output`.
Every error names the file, the line and the field. This module only reads; it scores nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localpers.errors import LocalpersError
from localpers.users.history import DEFAULT_TASK, HistoryItem, normalize_text

_UNSAFE_NAME = re.compile(r"[^a-z0-9_-]+")


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

    @property
    def store_name(self) -> str:
        """A name the user store accepts, e.g. "U 003!" -> "u-003"."""
        return store_name(self.user_id)

    def history_up_to(self, limit: int | None) -> tuple[HistoryItem, ...]:
        """The `limit` most recent history items (all of them for None)."""
        if limit is None:
            return self.history
        return self.history[-limit:] if limit > 0 else ()


def store_name(user_id: str) -> str:
    """A valid, stable user-store name for any user id: lowercase, [a-z0-9_-], at most 32 characters."""
    cleaned = _UNSAFE_NAME.sub("-", user_id.lower()).strip("-_") or "user"
    return cleaned[:32]


# The test file's protocol (../shared/data/news-headlines/README.md), applied to train authors by `dev_split`.
DEV_QUERY_FRACTION, DEV_MIN_QUERIES, DEV_MAX_QUERIES, DEV_MAX_HISTORY = 0.3, 5, 40, 100


def load_bench_users(
    path: Path | str,
    *,
    max_users: int | None = None,
    max_queries: int | None = None,
    task: str = DEFAULT_TASK,
    dev_split: bool = False,
) -> list[BenchUser]:
    """The users of `path` in file order, each with at most `max_queries` queries (first ones).

    With `dev_split` (for train authors, whose file holds only histories), each author's history is split as
    the test file was made: the most recent 30% (at least 5, at most 40) become the queries, and up to 100
    items before them the history; an author too short for 5 queries and one history item is left out.
    Settings are chosen on this split, never on the test file's queries.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise LocalpersError(f"{path}: no such file; pass the test JSONL with --data") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LocalpersError(f"{path}: cannot read ({exc})") from None
    users: list[BenchUser] = []
    seen: dict[str, int] = {}
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LocalpersError(f"{path} line {line_number}: not valid JSON ({exc.msg})") from None
        user = _user_from_record(path, line_number, record, task, max_queries, dev_split)
        if user is None:
            continue
        if user.store_name in seen:
            raise LocalpersError(
                f"{path} line {line_number}: user_id {user.user_id!r} collides with line "
                f"{seen[user.store_name]} (same name once made file-safe); give users distinct ids"
            )
        seen[user.store_name] = line_number
        users.append(user)
        if max_users is not None and len(users) >= max_users:
            break
    if not users:
        raise LocalpersError(f"{path} holds no users; expected JSONL lines with user_id, history, queries")
    return users


def _user_from_record(
    path: Path, line_number: int, record: Any, task: str, max_queries: int | None, dev_split: bool = False
) -> BenchUser | None:
    where = f"{path} line {line_number}"
    if not isinstance(record, dict):
        raise LocalpersError(f"{where}: expected a JSON object with user_id, history and queries")
    user_id = record.get("user_id")
    if not isinstance(user_id, str) or not user_id.strip():
        raise LocalpersError(f"{where}: field 'user_id' must be a non-empty string")
    history_records = record.get("history", [])
    query_records = record.get("queries")
    if not isinstance(history_records, list):
        raise LocalpersError(f"{where} (user {user_id}): field 'history' must be a list")
    if dev_split:
        if query_records is not None and not isinstance(query_records, list):
            raise LocalpersError(f"{where} (user {user_id}): field 'queries' must be a list")
        history_records, query_records = _dev_split([*history_records, *(query_records or [])])
        if not query_records:
            return None
    if not isinstance(query_records, list) or not query_records:
        raise LocalpersError(f"{where} (user {user_id}): field 'queries' must be a non-empty list")

    history: list[HistoryItem] = []
    known: set[str] = set()
    for index, entry in enumerate(history_records, start=1):
        text = _fields(entry, f"{where} (user {user_id}) history item {index}")
        item = HistoryItem.create(task, text["input"], text["output"], source=text["id"])
        if item.id not in known:
            known.add(item.id)
            history.append(item)

    queries: list[BenchQuery] = []
    query_ids: set[str] = set()
    for index, entry in enumerate(query_records[:max_queries] if max_queries else query_records, start=1):
        text = _fields(entry, f"{where} (user {user_id}) query {index}")
        query_id = text["id"] or f"q{index}"
        if query_id in query_ids:
            raise LocalpersError(f"{where} (user {user_id}) query {index}: duplicate id {query_id!r}")
        query_ids.add(query_id)
        queries.append(BenchQuery(query_id, normalize_text(text["input"]), normalize_text(text["output"])))
    return BenchUser(user_id, tuple(history), tuple(queries))


def dev_query_count(n_items: int) -> int:
    """How many of an author's `n_items` the dev split takes as queries (0 when the author is too short)."""
    count = min(DEV_MAX_QUERIES, max(DEV_MIN_QUERIES, round(DEV_QUERY_FRACTION * n_items)))
    return count if n_items >= count + 1 else 0


def _dev_split(records: list[Any]) -> tuple[list[Any], list[Any]]:
    """(history, queries) of one author's items, oldest first, as the test file splits them; ([], []) if too short."""
    count = dev_query_count(len(records))
    if not count:
        return [], []
    return records[:-count][-DEV_MAX_HISTORY:], records[-count:]


def _fields(entry: Any, where: str) -> dict[str, str]:
    """`input`, `output` (non-empty strings) and `id` ("" when absent) of one item."""
    if not isinstance(entry, dict):
        raise LocalpersError(f"{where}: expected a JSON object with 'input' and 'output'")
    out: dict[str, str] = {}
    for name in ("input", "output"):
        value = entry.get(name)
        if not isinstance(value, str) or not normalize_text(value):
            raise LocalpersError(f"{where}: field {name!r} must be a non-empty string")
        out[name] = value
    item_id = entry.get("id", "")
    if not isinstance(item_id, str | int):
        raise LocalpersError(f"{where}: field 'id' must be a string")
    out["id"] = str(item_id)
    return out
