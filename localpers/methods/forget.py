"""Forget what the methods derived from history items a user removed.

A removed item's text must not live on in files the methods keep beside the history: EXACT's index holds each
indexed input verbatim (and `rewrite --method exact` would still retrieve it), and CARD's y- cache holds the
model's rewrite of the input (EXACT's selection cache holds no text, but names the items by id).
`forget_removed_items` drops all three for every item no longer in the history.
It does not refit: the fitted vector, token bias and CoPe adapter were learned from the old history, and the
caller says so (`refit_hint`). The history file and its BM25 index are the user's store's to write.
"""

from __future__ import annotations

from collections.abc import Callable, Set

from localpers.errors import LocalpersError
from localpers.methods import exact_cache
from localpers.methods.card import pair_cache
from localpers.methods.exact_index import ExactIndex, index_path
from localpers.users.history import HistoryItem
from localpers.users.store import User


def remove_history_items(
    user: User, choose: Callable[[list[HistoryItem]], Set[str]]
) -> tuple[list[HistoryItem], list[HistoryItem]]:
    """Remove the items whose ids `choose` picks from the stored history, and what was derived from them.

    `choose` sees the history as read under the user's lock (it may raise to refuse); (removed, remaining).
    The one way the CLI and the TUI remove items, so none forgets the derived files.
    """
    with user.locked():
        items = user.history()
        chosen = choose(items)
        removed = [item for item in items if item.id in chosen]
        remaining = [item for item in items if item.id not in chosen]
        user.save_history(remaining, removing=True)
        forget_removed_items(user)
    return removed, remaining


def forget_removed_items(user: User) -> list[str]:
    """Prune the user's derived files to the items still in the history; the names of the files changed."""
    changed: list[str] = []
    with user.locked():
        kept = user.history_ids()
        if pair_cache.forget_negatives(user.dir, kept):
            changed.append(pair_cache.NEGATIVES_FILE)
        if exact_cache.forget_selections(user.dir, kept):
            changed.append(exact_cache.SELECTIONS_FILE)
        path = index_path(user)
        if path.is_file():
            try:
                index = ExactIndex.load(path, user.name)
            except LocalpersError:
                return changed  # a damaged index is refused by the rewrite itself, with how to rebuild it
            pruned = index.keeping(kept)
            if len(pruned.entries) != len(index.entries):
                pruned.save(path)
                changed.append(path.name)
    return changed
