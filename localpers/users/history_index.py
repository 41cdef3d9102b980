"""A user's history index: their examples per task with a BM25 index, cached next to the history, and the
entry points every rewrite builds its prompt through.

`HistoryIndex` holds one task's (input, output) pool and its retrieval index; `load` reads the cache
(`history_index.json`, keyed by the history file's hash, so a stale one is rebuilt) and `write` renews it
atomically when the history changes (a cache that cannot be written is dropped, never an error: the history
is what counts). `prompt_for_user`, `shown_for_user` and `shared_prefix_for_user` are how
`rewrite`, the TUI, the API and the fit ask for a prompt, the items it shows and the prefix all of a user's
prompts share: conditioned when the bundle has a format and the user a history, plain otherwise. The composition
itself is `localpers.users.history_prompt`'s. This module loads no model and opens no connection.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from localpers.atomic import atomic_write_text
from localpers.errors import LocalpersError
from localpers.regular_files import read_regular_file
from localpers.tasks import Task, get_task
from localpers.users.history import MAX_HISTORY_FILE_BYTES
from localpers.users.history_prompt import (
    PromptFormat,
    ShownExample,
    conditioned_prompt,
    history_document,
    select_examples,
    shared_prefix,
    shown_examples,
)
from localpers.users.retrieval import make_index
from localpers.users.series import word_set

INDEX_FILE = "history_index.json"
# 2: a history read each item once (`read_stored_history`); a version 1 cache of a file holding a line twice
# matches that file's text and would keep showing the copies
INDEX_VERSION = 2


class HistoryIndex:
    """A user's history examples for one task, with their BM25 index; cached as `history_index.json`.

    The cache holds only what the history already holds (texts of the user's own items) and a hash of
    the history file, so a stale cache (history changed behind it) is noticed and rebuilt.
    """

    def __init__(self, task: Task, pool: list[tuple[str, str]], retrieval: str = "bm25") -> None:
        self.task = task
        self.pool = pool
        self._index = make_index([history_document(task, i, o) for i, o in pool], retrieval) if pool else None
        self._word_sets: list[frozenset[str]] | None = None
        # When the index is a stored user's (`User.history_index`): their folder, where the engine may keep
        # the state of the prompts' shared block (`localpers.engine.prefix_files`), and their write lock,
        # taken without waiting. None for an index made from a pool.
        self.user_dir: Path | None = None
        self.write_lock: Callable[[], contextlib.AbstractContextManager[None]] | None = None

    def examples_for(self, text: str, count: int, recent: int = 0) -> list[str]:
        return select_examples(self.task, text, self.pool, count, self._index, recent=recent)

    def prompt_for(self, text: str, prompt_format: PromptFormat) -> str:
        words = self._series_words(prompt_format)
        return conditioned_prompt(self.task, text, self.pool, prompt_format, self._index, word_sets=words)

    def shown_for(self, text: str, prompt_format: PromptFormat) -> list[ShownExample]:
        """The items `prompt_for(text, prompt_format)` shows, each with why (`shown_examples`)."""
        words = self._series_words(prompt_format)
        return shown_examples(self.task, text, self.pool, prompt_format, self._index, word_sets=words)

    def _series_words(self, prompt_format: PromptFormat) -> list[frozenset[str]] | None:
        if prompt_format.series and self._word_sets is None:
            self._word_sets = [word_set(output) for _, output in self.pool]
        return self._word_sets

    @staticmethod
    def write(user_dir: Path, history_text: str, items: Sequence[Any]) -> None:
        """Write the cache for `items` (HistoryItem-like: task, input, output) atomically."""
        by_task: dict[str, list[list[str]]] = {}
        for item in items:
            by_task.setdefault(item.task, []).append([item.input, item.output])
        payload = {"version": INDEX_VERSION, "history_sha256": _sha256(history_text), "tasks": by_task}
        try:
            atomic_write_text(user_dir / INDEX_FILE, json.dumps(payload, ensure_ascii=False) + "\n")
        except LocalpersError:  # a full disk, or a folder or device where the cache goes
            # A cache: a stale one is noticed (its history digest) and rebuilt on read, so a full disk here
            # must not fail a command whose history was written. Drop the stale one if that is possible.
            with contextlib.suppress(OSError):
                (user_dir / INDEX_FILE).unlink()

    @staticmethod
    def forget(user_dir: Path) -> None:
        """Remove the cache (before the history changes: a stop between the two must not leave a removed item's
        text here); one that cannot be removed is stale from then on and rebuilt on read."""
        with contextlib.suppress(OSError):
            (user_dir / INDEX_FILE).unlink()

    @classmethod
    def load(
        cls,
        user_dir: Path,
        history_text: str,
        read_items: Callable[[], Sequence[Any]],
        task: Task,
        write_cache: Callable[[Sequence[Any]], None] | None = None,
    ) -> HistoryIndex:
        """The index for `task`, from the cache when it matches `history_text`, else rebuilt (and rewritten).

        `read_items` parses the history; it is called only when the cache is missing or stale. `write_cache`
        writes the rebuilt cache (default: `write`, unconditionally); a reader passes one that writes only
        while the history is still the text it read.
        """
        cached = _read_cache(user_dir / INDEX_FILE)
        if (
            cached is None
            or cached.get("version") != INDEX_VERSION
            or cached.get("history_sha256") != _sha256(history_text)
        ):
            items = read_items()
            if write_cache is None:
                cls.write(user_dir, history_text, items)
            else:
                write_cache(items)
            pool = [(item.input, item.output) for item in items if item.task == task.name]
        else:
            pool = [(pair[0], pair[1]) for pair in cached["tasks"].get(task.name, [])]
        return cls(task, pool)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _read_cache(path: Path) -> dict[str, Any] | None:
    try:
        raw = read_regular_file(path, MAX_HISTORY_FILE_BYTES * 2, what="history index", stored=True)
        data = json.loads(raw.decode("utf-8"))
    except (LocalpersError, ValueError, RecursionError):
        return None  # a missing, damaged or unreadable cache (a FIFO, a device) is rebuilt from the history
    tasks = data.get("tasks") if isinstance(data, dict) else None
    if not isinstance(tasks, dict) or not all(
        isinstance(rows, list)
        and all(isinstance(r, list) and len(r) == 2 and all(isinstance(x, str) for x in r) for r in rows)
        for rows in tasks.values()
    ):
        return None
    return data


def prompt_for_user(
    task_name: str,
    text: str,
    prompt_format: PromptFormat | None,
    index: HistoryIndex | None,
    note: str = "",
) -> str:
    """The one way every entry point builds a rewrite prompt: conditioned when the bundle and history allow.

    `note` (a plain prompt's line after the text, `Task.prompt_for`) is for plain prompts only."""
    task = get_task(task_name)
    if prompt_format is None or index is None:
        return task.prompt_for(text, note)
    if note:
        raise ValueError("a note after the text is for plain prompts only")
    return index.prompt_for(text, prompt_format)


def shown_for_user(
    task_name: str, text: str, prompt_format: PromptFormat | None, index: HistoryIndex | None
) -> list[ShownExample]:
    """The history items `prompt_for_user`'s prompt for `text` shows (none for a plain prompt)."""
    if prompt_format is None or index is None:
        return []
    return index.shown_for(text, prompt_format)


def shared_prefix_for_user(
    task_name: str, prompt_format: PromptFormat | None, index: HistoryIndex | None
) -> str:
    """What every `prompt_for_user` of this user, task and format starts with ("" when nothing is shared)."""
    if prompt_format is None or index is None:
        return ""
    return shared_prefix(get_task(task_name), index.pool, prompt_format)
