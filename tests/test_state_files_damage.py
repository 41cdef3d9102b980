"""A device, FIFO or folder where localpers keeps a small file (interruption audit).

A link to /dev/zero at `state.json` or the history's index cache made a command read until the kernel killed it
(24 GB); a FIFO made it hang; a folder named like the index cache failed `history add` after the item was saved.
Each is now refused in one line naming the file, or, for a cache, rebuilt, never read.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from localpers.cli import app
from localpers.errors import LocalpersError
from localpers.tasks import get_task
from localpers.users.history import HistoryItem
from localpers.users.history_index import INDEX_FILE
from localpers.users.lock import IDENTITY_FILE, read_identity
from localpers.users.ordinals import ORDINALS_FILE, read_ordinals
from localpers.users.store import UserStore


def user_with_history(name: str):
    user = UserStore().create(name)
    user.save_history([HistoryItem.create("headline", f"article {n}", f"Headline {n}") for n in range(3)])
    return user


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_state_json_that_is_a_device_or_fifo_is_refused_in_one_line(kind: str) -> None:
    user = user_with_history("ann")
    user.state_path.unlink(missing_ok=True)
    if kind == "dev-zero":
        user.state_path.symlink_to("/dev/zero")
    else:
        os.mkfifo(user.state_path)
    with pytest.raises(LocalpersError, match="not a regular file"):
        user.state()
    shown = CliRunner().invoke(app, ["user", "show", "ann"])
    assert shown.exit_code == 1 and "state.json is not a regular file" in shown.output
    assert len(shown.output.strip().splitlines()) == 1


def test_caches_and_the_identity_that_are_devices_are_not_read_but_rebuilt_or_ignored() -> None:
    user = user_with_history("bob")
    for name in (INDEX_FILE, ORDINALS_FILE, IDENTITY_FILE):
        (user.dir / name).unlink()
        (user.dir / name).symlink_to("/dev/zero")
    assert read_ordinals(user.dir) == {}
    assert read_identity(user.dir) is None
    index = user.history_index(get_task("headline"))  # rebuilt from the history, not read from the device
    assert len(index.pool) == 3


def test_a_folder_named_like_a_cache_does_not_fail_a_history_change() -> None:
    user = user_with_history("cay")
    for name in (INDEX_FILE, ORDINALS_FILE):
        (user.dir / name).unlink()
        (user.dir / name).mkdir()
    added = CliRunner().invoke(
        app, ["history", "add", "-i", "one more article", "-o", "One More", "--user", "cay"]
    )
    assert added.exit_code == 0, added.output
    assert len(user.history()) == 4
    assert len(user.history_index(get_task("headline")).pool) == 4


def test_review_mends_dangling_pointer_fifo_caches_cap_order_and_room_counts(tmp_path) -> None:
    """A dangling active.json reads as no active user (not 'no such file'); a FIFO y- cache is never read; the
    cache's cap keeps the newest entries over two writes; a history over the limit names the count that frees room."""
    from localpers.methods.card import pair_cache
    from localpers.users.history import MAX_HISTORY_ITEMS, serialize_history

    store = UserStore()
    user = user_with_history("dee")
    store.active_path.unlink(missing_ok=True)
    store.active_path.symlink_to(tmp_path / "gone.json")
    listed = CliRunner().invoke(app, ["history", "list"])
    assert "no active user" in listed.output, listed.output
    os.mkfifo(user.dir / pair_cache.NEGATIVES_FILE)
    assert pair_cache.read_negatives(user.dir, "key") == {}
    assert pair_cache.forget_negatives(user.dir, set()) is False
    (user.dir / pair_cache.NEGATIVES_FILE).unlink()
    original = pair_cache.NEGATIVES_FILE_ENTRIES
    pair_cache.NEGATIVES_FILE_ENTRIES = 4
    try:
        pair_cache.write_negatives(user.dir, "key", {k: k for k in "abcd"}, ["a"])
        known = {**pair_cache.read_negatives(user.dir, "key"), "e": "e", "f": "f"}
        pair_cache.write_negatives(user.dir, "key", known, ["a"])
        assert list(pair_cache.read_negatives(user.dir, "key")) == ["a", "d", "e", "f"]
    finally:
        pair_cache.NEGATIVES_FILE_ENTRIES = original
    items = [
        HistoryItem.create("headline", f"article {n}", f"Headline {n}") for n in range(MAX_HISTORY_ITEMS + 3)
    ]
    user.history_path.write_text(serialize_history(items), encoding="utf-8")
    refused = CliRunner().invoke(app, ["history", "add", "-i", "x", "-o", "Y", "--user", "dee"])
    assert refused.exit_code == 2 and "--oldest 4 --user dee" in refused.output, refused.output


def test_a_history_linked_to_nothing_is_refused_not_read_as_empty_and_replaced(tmp_path) -> None:
    user = UserStore().create("dan")
    elsewhere = tmp_path / "unmounted" / "history.jsonl"
    user.history_path.unlink(missing_ok=True)
    user.history_path.symlink_to(elsewhere)  # a history kept on a drive that is not mounted now
    for args in (["history", "list", "--user", "dan"], ["history", "add", "-u", "dan", "-i", "a", "-o", "b"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 1, result.output
        assert "is a link to" in result.output and "which does not exist" in result.output
    assert user.history_path.is_symlink() and os.readlink(user.history_path) == str(elsewhere)
    with pytest.raises(LocalpersError, match="which does not exist"):
        user.history_index(get_task("headline"))


def test_a_history_kept_elsewhere_through_a_link_stays_there_when_items_are_added(tmp_path: Path) -> None:
    """The first save replaced the link by a file in the user's folder: the linked history (a synced copy, another
    drive) silently stopped receiving items (store audit)."""
    user = user_with_history("eve")
    elsewhere = tmp_path / "synced" / "history.jsonl"
    elsewhere.parent.mkdir()
    os.rename(user.history_path, elsewhere)
    user.history_path.symlink_to(elsewhere)
    added = CliRunner().invoke(
        app, ["history", "add", "-u", "eve", "-i", "A new article.", "-o", "A new headline"]
    )
    assert added.exit_code == 0, added.output
    assert user.history_path.is_symlink() and os.readlink(user.history_path) == str(elsewhere)
    assert "A new headline" in elsewhere.read_text(encoding="utf-8")
    assert [p.name for p in elsewhere.parent.iterdir()] == ["history.jsonl"]  # no temp file left beside it


def test_a_history_link_that_loops_or_leads_nowhere_is_refused_on_writing_it(tmp_path: Path) -> None:
    """Written through, a link to itself raised Python's RuntimeError (a traceback) and one to nothing created its
    target, which every reader refuses (the session's review)."""
    user = user_with_history("fay")
    items = user.history()
    user.history_path.unlink()
    for target in (user.history_path, tmp_path / "gone" / "history.jsonl"):
        user.history_path.symlink_to(target)
        with pytest.raises(LocalpersError, match="which does not exist or loops"):
            user.save_history(items)
        user.history_path.unlink()


def test_the_fits_caches_where_a_folder_or_fifo_stands_are_left_stale_not_an_error(tmp_path) -> None:
    """A folder or FIFO at negatives.json, pair_features.safetensors or exact-selections.json ended every fit after
    its y- were generated or its first attribute search (seventy-eighth session's review): a cache that cannot be
    written stays as it was, as SECURITY.md says."""
    import numpy as np

    from localpers.methods import exact_cache
    from localpers.methods.card import pair_cache

    (tmp_path / pair_cache.NEGATIVES_FILE).mkdir()
    os.mkfifo(tmp_path / pair_cache.FEATURES_FILE)
    (tmp_path / exact_cache.SELECTIONS_FILE).mkdir()
    pair_cache.write_negatives(tmp_path, "key", {"item": "A headline"})
    pair_cache.write_features(tmp_path, "key", 2, {"pair": (np.zeros(2, np.float32), -1.0)})
    record = exact_cache.SelectionRecord("digest", ("Concise",), 1.0, 0.5)
    assert exact_cache.write_selections(tmp_path, "key", {"item": record}) is False
    assert (tmp_path / pair_cache.NEGATIVES_FILE).is_dir() and (
        tmp_path / exact_cache.SELECTIONS_FILE
    ).is_dir()
    assert exact_cache.write_selections(tmp_path / "elsewhere", "key", {}) is False  # no such folder either
