"""When history items were written, from their optional "date" field, and a list put oldest first by it.

History files and the benchmark's corpus may carry an ISO 8601 "date" per item (a day, or a day and a time). A
file that lists such items out of order is taken oldest first, since "recent" is the order items are added. This
module reads dates and sorts; it never reads files and never changes an item.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
# a clock time after the day, with its offset if any: "T09:30", " 9:30:05.5", "T0930Z", " 09:30 +02:00"
_CLOCK = re.compile(
    r"[T ](?P<hour>\d{1,2})(?P<rest>(?::?\d{2}(?::?\d{2}(?:[.,]\d+)?)?)?"
    r"(?:\s*(?:Z|[+-]\d{2}(?::?\d{2}(?::?\d{2}(?:[.,]\d+)?)?)?))?)"
)
_SPACED_CLOCK = re.compile(r" \d{1,2}:")
_UTC_NAME = re.compile(r"(?:UTC|GMT|Z)?(?:\[(?:UTC|GMT|Etc/UTC)\])?", re.IGNORECASE)
T = TypeVar("T")


def item_date(record: Any) -> str | None:
    """The ISO date (YYYY-MM-DD) a record's "date" field starts with, else None."""
    value = record.get("date") if isinstance(record, dict) else None
    if isinstance(value, str) and _ISO_DATE.match(value.strip()):
        return value.strip()[:10]
    return None


def item_time(record: Any) -> datetime | None:
    """When a record's "date" field says it was written (UTC; a date alone is its midnight, a time without a zone is
    read as UTC), else None: not a date, or a date with a clock time or offset that is none (25:30, +25:00)."""
    day = item_date(record)
    if day is None:
        return None
    text = record["date"].strip()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        moment = _day_and_clock(text, day)
        if moment is None:
            return None
    try:
        return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00: before the first moment a datetime can hold in UTC
        return None


def _day_and_clock(text: str, day: str) -> datetime | None:
    """The moment of a "date" Python's parser refused whole: its day and clock time when a clock time follows the
    day ("T0930", or after a space "9:30"), with a zone name after it only if that says UTC ("09:30 UTC"); its
    midnight when words do ("2024-01-01 (evening)", "2024-05-02 3 pages"); None for a clock time or offset that is
    none (T25:30, 10:00+25:00), another zone's name ("09:30 CET", "GMT+2") and text run on after the day or the
    time ("2024-01-01garbage", "2024-01-01 12:30pm")."""
    if text[10:11] not in ("T", " "):
        return None
    if text[10] == " " and not _SPACED_CLOCK.match(text, 10):
        return _parse(
            day
        )  # after a space only "H:" starts a clock time: "2024-05-02 3 pages" is a day and words
    clock = _CLOCK.match(text, 10)
    if clock is None:
        return _parse(day)
    # only a zone name that says UTC may follow ("09:30 UTC", "Z[UTC]"): another zone ("GMT+2", "CET") would be
    # read hours off, and letters or digits run on ("12:30pm") make it no clock time
    if not _UTC_NAME.fullmatch(text[clock.end() :].strip()):
        return None
    return _parse(f"{day}T{clock['hour']:0>2}{clock['rest']}")


def _parse(text: str) -> datetime | None:
    """`datetime.fromisoformat(text)`, or None where it refuses the text (2024-13-45, 25:30)."""
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def oldest_first(
    entries: list[T], record_of: Callable[[T], Any] = lambda entry: entry
) -> tuple[list[T], bool]:
    """`entries` sorted by their records' dates and times (stably) when every one is dated and they are out of
    order; whether it sorted. An undated or partly dated list keeps its order."""
    times = [item_time(record_of(entry)) for entry in entries]
    known = [moment for moment in times if moment is not None]
    if not known or len(known) < len(times) or known == sorted(known):
        return entries, False
    order = sorted(range(len(entries)), key=lambda index: known[index])
    return [entries[index] for index in order], True
