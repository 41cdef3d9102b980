"""Cases the ninety-fourth session's mutation round of `localpers/methods/forget.py` and
`localpers/methods/card/pair_cache.py` found untested (each let a changed line pass the tests of removal and of
the caches there were).

Removing the whole history prunes what was derived from it too; a stop after a removal was saved says so; the
pruned selection cache is named among the files changed; an EXACT index written by another version is left to
the rewrite that refuses it, not deleted; and of the items left that share a removed item's input, the one that
takes its place in the index is a remaining one, with a non-negative gain, the largest margin, matched on the
input without the task's instruction, as the fit would choose (and never an item removed with it, which two
lines keep out; that test guards them together).

The pair cache: a pair's hash names its cluster, prompt, output and y- and keeps its stored length; features are
read under their own key and dimension only, with as many log-probabilities as pairs and a list of pairs; a
log-probability of 0 is valid; the y- cache's bound counts only this fit's keys that have a y-; the features
cache keeps the first pairs it is given.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_forget_removed import CACHE_KEY, files_holding, user_with_derived_files
from typer.testing import CliRunner

from localpers.cli import app
from localpers.methods import exact_cache
from localpers.methods.card.pair_cache import read_negatives
from localpers.methods.exact_index import ExactIndex, IndexEntry, index_path, load_index
from localpers.methods.forget import forget_removed_items, remove_history_items
from localpers.users.history import HistoryItem
from localpers.users.store import User, UserStore

META = {
    "bundle_sha256": "b" * 64,
    "adapter": "cluster-0",
    "k": 2,
    "library": ["Base", "Formal"],
    "fitted_by": "localpers test",
}


def test_removing_the_whole_history_prunes_every_derived_file() -> None:
    """The history is written after its derived files are pruned, so "kept" is the empty set here, not "all the
    items stored" (a falsy set read as no set kept every removed text)."""
    user, items = user_with_derived_files("ann")
    removed, remaining = remove_history_items(user, lambda stored: {item.id for item in stored})
    assert len(removed) == len(items) and remaining == []
    assert files_holding(user, "ZQXSECRET") == []
    assert read_negatives(user.dir, CACHE_KEY) == {}


def test_a_stop_after_a_removal_was_saved_says_the_work_was_saved(monkeypatch: pytest.MonkeyPatch) -> None:
    from localpers.cli import history_remove

    _, items = user_with_derived_files("bob")

    def ctrl_c_while_printing(*args: object, **kwargs: object) -> str:
        raise KeyboardInterrupt  # lands after the save, while the summary is printed

    monkeypatch.setattr(history_remove, "refit_hint", ctrl_c_while_printing)
    for args in (["history", "remove", items[0].id[:8]], ["history", "remove", "--oldest", "1"]):
        result = CliRunner().invoke(app, [*args, "--user", "bob"])
        assert result.exit_code == 130, result.output
        assert "interrupted; this came after the work was saved: user 'bob' now has" in result.output


def test_the_pruned_selection_cache_is_named_among_the_changed_files() -> None:
    user, items = user_with_derived_files("cay")
    key = exact_cache.selections_key(
        META["bundle_sha256"], "cluster-0", 2, META["library"], META["fitted_by"]
    )
    records = {
        item.id: exact_cache.SelectionRecord(f"d{n}", ("Base",), 0.5, 0.1) for n, item in enumerate(items)
    }
    assert exact_cache.write_selections(user.dir, key, records)
    user.save_history(items[1:])
    assert exact_cache.SELECTIONS_FILE in forget_removed_items(user)


def test_an_index_of_another_version_is_left_to_the_rewrite_not_deleted() -> None:
    """Only a damaged index (which may hold the removed text and cannot be pruned) is deleted; another version's
    is refused by `rewrite --method exact` with how to rebuild it, and a removal leaves it as it is."""
    user, items = user_with_derived_files("dee")
    path = index_path(user)
    from safetensors import safe_open
    from safetensors.numpy import save

    with safe_open(str(path), framework="numpy") as handle:
        embeddings = handle.get_tensor("embeddings")
        payload = json.loads((handle.metadata() or {})["exact"])
    payload["version"] = 999
    path.write_bytes(save({"embeddings": embeddings}, metadata={"exact": json.dumps(payload)}))
    before = path.read_bytes()
    user.save_history(items[1:])
    assert path.name not in forget_removed_items(user)
    assert path.read_bytes() == before


def _user_with_shared_input(
    name: str, items: list[HistoryItem], records: dict[str, tuple[float, float]]
) -> User:
    """A user whose index holds `items[0]` (and a second, unrelated item last in `items`), with a selection record
    (margin, base margin) for each item named in `records`."""
    user = UserStore().create(name)
    user.save_history(items)
    entries = [
        IndexEntry(items[0].id, "headline", items[0].input, ["Formal"], 0.9, 0.2),
        IndexEntry(items[-1].id, "headline", items[-1].input, ["Base"], 0.5, 0.1),
    ]
    ExactIndex(entries, np.eye(2, 384, dtype=np.float32), dict(META)).save(index_path(user))
    key = exact_cache.selections_key(
        META["bundle_sha256"], "cluster-0", 2, META["library"], META["fitted_by"]
    )
    selections = {
        item_id: exact_cache.SelectionRecord(f"d{n}", ("Base", "Formal"), margin, base)
        for n, (item_id, (margin, base)) in enumerate(records.items())
    }
    assert exact_cache.write_selections(user.dir, key, selections)
    return user


SHARED = "The council votes on the new tram line tonight."
RAIN = HistoryItem.create("headline", "Rain is expected all week.", "Wet Week Ahead")


def test_an_item_removed_with_the_indexed_one_does_not_take_its_place() -> None:
    """Held twice: a removed item is not among the candidates, and its search is pruned from the selection cache
    before the index is (either alone keeps it out; this test fails only where both go)."""
    best = HistoryItem.create("headline", SHARED, "TRAM VOTE TONIGHT!!!")
    other = HistoryItem.create("headline", SHARED, "ZQXSECRET tram headline")
    user = _user_with_shared_input("eve", [best, other, RAIN], {best.id: (0.9, 0.2), other.id: (0.6, 0.2)})
    remove_history_items(user, lambda stored: {best.id, other.id})
    assert [entry.item_id for entry in load_index(user).entries] == [RAIN.id]


def test_a_remaining_item_with_no_gain_over_the_plain_prompt_still_takes_the_place() -> None:
    """The fit's filter keeps a gain of exactly 0 (`selection.gain >= 0`)."""
    best = HistoryItem.create("headline", SHARED, "TRAM VOTE TONIGHT!!!")
    other = HistoryItem.create("headline", SHARED, "Tram Line Faces Vote")
    user = _user_with_shared_input("fay", [best, other, RAIN], {best.id: (0.9, 0.2), other.id: (0.3, 0.3)})
    remove_history_items(user, lambda stored: {best.id})
    assert [(entry.item_id, entry.margin) for entry in load_index(user).entries] == [
        (other.id, 0.3),
        (RAIN.id, 0.5),
    ]


def test_of_several_remaining_items_the_largest_margin_takes_the_place() -> None:
    best = HistoryItem.create("headline", SHARED, "TRAM VOTE TONIGHT!!!")
    lower = HistoryItem.create("headline", SHARED, "Tram Line Faces Vote")
    higher = HistoryItem.create("headline", SHARED, "Tram Vote Tonight")
    middle = HistoryItem.create("headline", SHARED, "Council To Vote On Tram")
    records = {best.id: (0.9, 0.2), lower.id: (0.3, 0.2), higher.id: (0.7, 0.2), middle.id: (0.5, 0.2)}
    user = _user_with_shared_input("gus", [best, lower, higher, middle, RAIN], records)
    remove_history_items(user, lambda stored: {best.id})
    assert [entry.item_id for entry in load_index(user).entries] == [higher.id, RAIN.id]


def test_an_input_given_with_the_tasks_instruction_matches_the_same_text_without_it() -> None:
    """The index keys an input by what it embeds, the text without the task's instruction in front (as the shared
    data gives inputs): an item written with the instruction shares the indexed item's input."""
    from localpers.tasks import get_task

    best = HistoryItem.create("headline", SHARED, "TRAM VOTE TONIGHT!!!")
    instruction = get_task("headline").instruction
    assert instruction
    other = HistoryItem.create("headline", f"{instruction} {SHARED}", "Tram Line Faces Vote")
    user = _user_with_shared_input("hal", [best, other, RAIN], {best.id: (0.9, 0.2), other.id: (0.6, 0.2)})
    remove_history_items(user, lambda stored: {best.id})
    assert [entry.item_id for entry in load_index(user).entries] == [other.id, RAIN.id]


# The fit's pair cache (`localpers/methods/card/pair_cache.py`).


def test_a_pairs_hash_names_every_part_of_the_pair_and_keeps_its_stored_length() -> None:
    """One pair's features are another adapter's (cluster), prompt's, output's or y-'s nowhere; 24 hex characters
    as the caches written so far hold, so an upgrade does not throw them all away."""
    from localpers.methods.card.pair_cache import pair_hash

    parts = (0, "prompt", "output", "negative")
    digest = pair_hash(*parts)
    assert len(digest) == 24 and int(digest, 16) >= 0
    for changed in ((1, *parts[1:]), (0, "other", *parts[2:]), (0, "prompt", "other", "negative")):
        assert pair_hash(*changed) != digest
    assert pair_hash(0, "prompt", "output", "other") != digest


def test_cached_features_are_read_under_their_own_key_and_dimension_only(tmp_path: Path) -> None:
    from localpers.methods.card import pair_cache

    pairs = {"a": (np.ones(4, np.float32), -1.5), "b": (np.zeros(4, np.float32), -0.5)}
    assert pair_cache.write_features(tmp_path, "bundle-1:cluster-0", 4, pairs)
    assert list(pair_cache.read_features(tmp_path, "bundle-1:cluster-0", 4)) == ["a", "b"]
    assert pair_cache.read_features(tmp_path, "bundle-2:cluster-0", 4) == {}  # another bundle's features
    assert pair_cache.read_features(tmp_path, "bundle-1:cluster-0", 2) == {}  # another head's dimension


def test_cached_features_whose_pair_list_is_not_a_list_read_as_absent(tmp_path: Path) -> None:
    from safetensors.numpy import save

    from localpers.methods.card import pair_cache

    tensors = {"differences": np.ones((1, 4), np.float32), "first_logprobs": np.full(1, -1.0, np.float32)}
    for pairs in ('{"a": 1}', '"a"'):
        (tmp_path / pair_cache.FEATURES_FILE).write_bytes(
            save(tensors, metadata={"key": "k", "pairs": pairs})
        )
        assert pair_cache.read_features(tmp_path, "k", 4) == {}


def test_the_y_minus_cache_keeps_this_fits_entries_then_the_newest_within_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys of this fit that have no y- (none was generated) take no place among the kept."""
    from localpers.methods.card import pair_cache

    monkeypatch.setattr(pair_cache, "NEGATIVES_FILE_ENTRIES", 3)
    known = {key: f"y- {key}" for key in "abcde"}
    assert pair_cache.write_negatives(tmp_path, "key", known, used=["x", "y", "a"])
    assert list(pair_cache.read_negatives(tmp_path, "key")) == ["a", "d", "e"]


def test_cached_features_with_one_log_probability_too_few_read_as_absent(tmp_path: Path) -> None:
    from safetensors.numpy import save

    from localpers.methods.card import pair_cache

    tensors = {"differences": np.ones((2, 4), np.float32), "first_logprobs": np.full(1, -1.0, np.float32)}
    metadata = {"key": "k", "pairs": '["a", "b"]'}
    (tmp_path / pair_cache.FEATURES_FILE).write_bytes(save(tensors, metadata=metadata))
    assert pair_cache.read_features(tmp_path, "k", 4) == {}


def test_a_first_token_the_model_was_certain_of_is_a_valid_cached_log_probability(tmp_path: Path) -> None:
    """log 1 = 0 is what a fit computes for a first token of probability 1; only above 0 is impossible."""
    from localpers.methods.card import pair_cache

    assert pair_cache.write_features(tmp_path, "k", 4, {"a": (np.ones(4, np.float32), 0.0)})
    assert pair_cache.read_features(tmp_path, "k", 4)["a"][1] == 0.0


def test_the_features_cache_keeps_the_first_pairs_within_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fit passes this fit's pairs first: they are the ones kept."""
    from localpers.methods.card import pair_cache

    monkeypatch.setattr(pair_cache, "FEATURES_FILE_PAIRS", 2)
    pairs = {key: (np.full(4, n, np.float32), -1.0) for n, key in enumerate("abc")}
    assert pair_cache.write_features(tmp_path, "k", 4, pairs)
    assert list(pair_cache.read_features(tmp_path, "k", 4)) == ["a", "b"]


def test_both_caches_hold_a_full_historys_pairs_twice_over() -> None:
    """The choice's refits add pairs of other prompts: a bound under two full histories' would make refits of a
    long history generate y- again."""
    from localpers.methods.card import pair_cache
    from localpers.users.history import MAX_HISTORY_ITEMS

    assert pair_cache.FEATURES_FILE_PAIRS >= 2 * MAX_HISTORY_ITEMS
    assert pair_cache.NEGATIVES_FILE_ENTRIES >= 2 * MAX_HISTORY_ITEMS
