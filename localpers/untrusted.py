"""Helpers for input that comes from outside this device: JSON text and text shown in one line.

`parse_json` turns any JSON failure (syntax, nesting deeper than `MAX_JSON_DEPTH`, integers longer
than Python's 4300-digit limit, duplicate keys when asked) into `JSONProblem`, a ValueError with a
short reason, so callers can name their file and field in a one-line `LocalpersError` instead of a
traceback. `one_line` escapes control and line-separator characters so a message stays one line and
cannot drive the terminal. This module reads no files and raises no `LocalpersError` itself.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

MAX_JSON_DEPTH = 64  # the deepest of our formats nests 4 levels; anything far deeper is hostile


class JSONProblem(ValueError):
    """Why a piece of outside JSON was refused, as one short line."""


def _depth_exceeds(value: Any, limit: int) -> bool:
    """True when containers nest deeper than `limit` (iterative: no recursion to exhaust)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        if isinstance(current, dict):
            children = current.values()
        elif isinstance(current, list):
            children = current
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An `object_pairs_hook` that refuses an object naming the same key twice."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise JSONProblem(f"duplicate key {one_line(key)!r}")
        seen[key] = value
    return seen


def parse_json(
    text: str | bytes,
    *,
    object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
    max_depth: int = MAX_JSON_DEPTH,
    allow_nan: bool = True,
) -> Any:
    """`json.loads`, with every way outside text can fail raised as `JSONProblem`; bytes may open with a UTF-8
    byte-order mark (a state.json or config.json edited in Notepad). `allow_nan=False` refuses Python's extensions
    `NaN`, `Infinity` and `-Infinity`, which are not JSON, and numbers past a float's range (1e999)."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8-sig")  # a byte-order mark, as Windows editors save one, is not content
        value = json.loads(
            text,
            object_pairs_hook=object_pairs_hook,
            parse_constant=None if allow_nan else _not_json_constant,
            parse_float=None if allow_nan else _finite_float,
        )
    except UnicodeDecodeError:
        raise JSONProblem("not UTF-8 text") from None
    except JSONProblem:
        raise
    except json.JSONDecodeError as exc:
        # Some of json's messages end in "at" ("Unterminated string starting at"): no second one
        where = f"line {exc.lineno} column {exc.colno}"
        raise JSONProblem(
            f"{exc.msg} {where}" if exc.msg.endswith(" at") else f"{exc.msg} at {where}"
        ) from None
    except RecursionError:
        raise JSONProblem(f"nested deeper than {max_depth} levels") from None
    except ValueError as exc:
        if "digits" in str(exc):  # int() refuses integer strings longer than 4300 digits
            raise JSONProblem("a number has more digits than the 4300 Python accepts") from None
        raise JSONProblem(one_line(str(exc), limit=120)) from None
    if _depth_exceeds(value, max_depth):
        raise JSONProblem(f"nested deeper than {max_depth} levels")
    return value


def _not_json_constant(name: str) -> Any:
    raise JSONProblem(f"{name} is not a JSON value (write a number, or null)")


def _finite_float(text: str) -> float:
    """A JSON number as a float; one past a float's range (1e999) is refused, not read as infinity."""
    value = float(text)
    if not math.isfinite(value):
        raise JSONProblem(
            f"the number {one_line(text, limit=40)} is out of range (write a smaller one, or null)"
        )
    return value


def unencodable_field(value: Any, path: str = "") -> str | None:
    """The JSON path (`messages[0].content`) of the first key or string in `value` that is not Unicode text
    (a lone UTF-16 surrogate such as JSON's "\\ud800" escape, which no UTF-8 consumer can encode); None if all are."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        current, where = stack.pop()
        if isinstance(current, str):
            try:
                current.encode("utf-8")
            except UnicodeEncodeError:
                return where or "the body"
        elif isinstance(current, dict):
            for key, child in reversed(list(current.items())):
                inner = f"{where}.{key}" if where else str(key)
                try:
                    str(key).encode("utf-8")
                except UnicodeEncodeError:
                    return f"{where or 'the body'} (a key)"
                stack.append((child, inner))
        elif isinstance(current, list):
            stack.extend((child, f"{where}[{index}]") for index, child in reversed(list(enumerate(current))))
    return None


# Invisible characters that are part of ordinary writing, shown as they are: the zero-width (non-)joiner of
# emoji sequences and Persian or Indic words, emoji and text presentation selectors, the soft hyphen.
_WRITING_FORMAT_CHARACTERS = frozenset("\u200c\u200d\ufe0e\ufe0f\u00ad")


def one_line(text: str, limit: int | None = None) -> str:
    """`text` with line breaks, control and other unprintable characters escaped (\\n, \\x1b, \\u2028);
    the joiners and selectors of ordinary writing (`_WRITING_FORMAT_CHARACTERS`) are kept."""
    if limit is not None and len(text) > limit:
        text = text[:limit] + "..."
    if text.isprintable():
        return text
    return "".join(
        ch if ch.isprintable() or ch in _WRITING_FORMAT_CHARACTERS else ascii(ch)[1:-1] for ch in text
    )
