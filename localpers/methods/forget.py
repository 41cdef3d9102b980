"""Forget what the methods derived from history items a user removed.

A removed item's text must not live on in files the methods keep beside the history: EXACT's index holds each
indexed input verbatim (and `rewrite --method exact` would still retrieve it), and CARD's y- cache holds the
model's rewrite of the input. `forget_removed_items` drops both for every item no longer in the history.
It does not refit: the fitted vector, token bias and CoPe adapter were learned from the old history, and the
caller says so (`refit_hint`). The history file and its BM25 index are the user's store's to write.
"""

from __future__ import annotations

from localpers.errors import LocalpersError
from localpers.methods.card import pair_cache
from localpers.methods.exact_index import ExactIndex, index_path
from localpers.users.store import User


def forget_removed_items(user: User) -> list[str]:
    """Prune the user's derived files to the items still in the history; the names of the files changed."""
    changed: list[str] = []
    with user.locked():
        kept = {item.id for item in user.history()}
        if pair_cache.forget_negatives(user.dir, kept):
            changed.append(pair_cache.NEGATIVES_FILE)
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
