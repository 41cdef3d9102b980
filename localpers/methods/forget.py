"""Forget what the methods derived from history items a user removed.

A removed item's text must not live on in files the methods keep beside the history: EXACT's index holds each
indexed input verbatim (and `rewrite --method exact` would still retrieve it), and CARD's y- cache holds the
model's rewrite of the input (EXACT's selection cache holds no text, but names the items by id).
`forget_removed_items` drops all three for every item no longer in the history; where a removed item's input is
another remaining item's of the same task too, the index keeps the input with that item's attributes, as a fit
would.
It does not refit: the fitted vector, token bias and CoPe adapter were learned from the old history, and the
caller says so (`refit_hint`). The history file and its BM25 index are the user's store's to write.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Set

from localpers.errors import InputError, LocalpersError
from localpers.methods import exact_cache
from localpers.methods.card import pair_cache
from localpers.methods.exact_index import ExactIndex, IndexEntry, index_path
from localpers.tasks import get_task
from localpers.users.history import HistoryItem
from localpers.users.store import User


def remove_history_items(
    user: User,
    choose: Callable[[list[HistoryItem]], Set[str]],
    on_saved: Callable[[list[HistoryItem]], None] | None = None,
) -> tuple[list[HistoryItem], list[HistoryItem]]:
    """Remove the items whose ids `choose` picks from the stored history, and what was derived from them.

    `choose` sees the history as read under the user's lock (it may raise to refuse); (removed, remaining).
    The one way the CLI and the TUI remove items, so none forgets the derived files. Those are pruned first:
    a stop (Ctrl-C, a full disk) before the history is written leaves the items in it and their derived
    entries to be made again by the next fit, never a removed text in a file no command would prune again.
    `on_saved` gets the remaining items as soon as the history is written (`User.save_history`).
    """
    with user.locked():
        items = user.history()
        chosen = choose(items)
        removed = [item for item in items if item.id in chosen]
        remaining = [item for item in items if item.id not in chosen]
        forget_removed_items(user, {item.id for item in remaining})
        user.save_history(
            remaining, removing=True, on_saved=None if on_saved is None else lambda: on_saved(remaining)
        )
    return removed, remaining


def forget_removed_items(user: User, kept: Set[str] | None = None) -> list[str]:
    """Prune the user's derived files to the items `kept` (by default those in the history); the names of the
    files changed."""
    changed: list[str] = []
    with user.locked():
        kept = user.history_ids() if kept is None else kept
        if pair_cache.forget_negatives(user.dir, kept):
            changed.append(pair_cache.NEGATIVES_FILE)
        if exact_cache.forget_selections(user.dir, kept):
            changed.append(exact_cache.SELECTIONS_FILE)
        path = index_path(user)
        if path.is_file():
            try:
                index = ExactIndex.load(path, user.name)
            except (
                InputError
            ):  # damaged: it cannot be pruned and may hold the removed item's text, so it goes
                path.unlink(missing_ok=True)  # (derived data: the next `fit --method exact` builds it again)
                changed.append(path.name)
                return changed
            except LocalpersError:
                return changed  # another version's: refused by the rewrite itself, with how to rebuild it
            if any(entry.item_id not in kept for entry in index.entries):
                index.keeping(kept, _successors(user, index, kept)).save(path)
                changed.append(path.name)
    return changed


def _successors(user: User, index: ExactIndex, kept: Set[str]) -> dict[int, IndexEntry]:
    """For each row of a removed item, the entry of a remaining item of the same task with the same input, where the
    fit would have indexed one: row -> entry.

    Of several items of one task with one input the fit indexes only the one whose attributes gave the largest margin
    (`exact.keep_for_index`); removing that one dropped the input from the index although the others remain.
    Their searches are in the selection cache under the index's key (same bundle, adapter, k, library and fit
    format), and the input's embedding is the removed entry's row. Without such a record (an index from before
    the cache, a search never made because the fit's window left the item out) the input stays out until the
    next fit. A hand-edited entry whose task is unknown is left to the fit too.
    """
    meta = index.meta
    try:
        key = exact_cache.selections_key(
            meta["bundle_sha256"],
            meta["adapter"],
            meta["k"],
            meta["library"],
            meta["fitted_by"],
            meta.get("search"),
        )
        records = exact_cache.read_selections(user.dir, key, meta["library"], meta["k"])
    except (KeyError, TypeError):
        return {}
    indexed = {entry.item_id for entry in index.entries if entry.item_id in kept}
    unindexed: dict[tuple[str, str], list[HistoryItem]] = {}
    for item in user.history():
        if item.id in kept and item.id not in indexed and item.id in records:
            with contextlib.suppress(LocalpersError):
                unindexed.setdefault(_indexed_text(item.task, item.input), []).append(item)
    successors: dict[int, IndexEntry] = {}
    for row, entry in enumerate(index.entries):
        if entry.item_id in kept:
            continue
        try:
            same_input = unindexed.pop(_indexed_text(entry.task, entry.input), [])
        except LocalpersError:
            continue
        # the fit's non-negative gain filter, then the largest margin (the first one of equals)
        candidates = [item for item in same_input if records[item.id].margin >= records[item.id].base_margin]
        if candidates:
            item = max(candidates, key=lambda one: records[one.id].margin)
            record = records[item.id]
            successors[row] = IndexEntry.of(item, record.attributes, record.margin, record.base_margin)
    return successors


def _indexed_text(task: str, text: str) -> tuple[str, str]:
    """An input's key in the index: its task and what the index embeds of it (`exact.index_key`, not imported:
    that module loads the engine)."""
    return task, get_task(task).content(text)
