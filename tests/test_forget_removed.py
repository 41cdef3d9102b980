"""A removed history item leaves no copy in the files the methods derived from it (privacy audit).

Before, `history remove` and the TUI's remove rewrote the history and its BM25 index only: EXACT's index still
held the input verbatim (and `rewrite --method exact` retrieved it), and CARD's y- cache the model's rewrite of it.
"""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from localpers.cli import app
from localpers.methods.card.pair_cache import NEGATIVES_FILE, read_negatives
from localpers.methods.exact_index import ExactIndex, IndexEntry, index_path, load_index
from localpers.methods.forget import forget_removed_items
from localpers.tui.userdata import remove_history_item
from localpers.users.history import HistoryItem
from localpers.users.store import User, UserStore

SECRET = "ZQXSECRET the clinic's unlisted number"
PAIRS = [
    ("A bakery sells day-old bread at half price.", "Loaf Story Short"),
    (SECRET, "A Number Nobody Should See"),
    ("Library hours extend to Sundays.", "Booked Solid"),
]
CACHE_KEY = "bundle:adapter"


def user_with_derived_files(name: str) -> tuple[User, list[HistoryItem]]:
    """A user whose EXACT index and y- cache hold an entry for every history item, as a fit leaves them."""
    user = UserStore().create(name)
    items = [HistoryItem.create("headline", text, headline) for text, headline in PAIRS]
    user.save_history(items)
    entries = [IndexEntry(item.id, "headline", item.input, ["Base"], 0.5, 0.1) for item in items]
    embeddings = np.eye(len(items), 384, dtype=np.float32)
    ExactIndex(entries, embeddings, {"cluster": 0, "library": ["Base"]}).save(index_path(user))
    negatives = {item.id: f"model's rewrite of {item.input}" for item in items}
    negatives |= {f"{item.id}:0123456789ab": f"conditioned rewrite of {item.input}" for item in items}
    (user.dir / NEGATIVES_FILE).write_text(json.dumps({CACHE_KEY: negatives}), encoding="utf-8")
    return user, items


def files_holding(user: User, text: str) -> list[str]:
    needle = text.encode("utf-8")
    return sorted(p.name for p in user.dir.rglob("*") if p.is_file() and needle in p.read_bytes())


def assert_only_the_others_are_left(user: User, items: list[HistoryItem]) -> None:
    assert files_holding(user, "ZQXSECRET") == []
    kept = {items[0].id, items[2].id}
    index = load_index(user)
    assert {entry.item_id for entry in index.entries} == kept
    assert index.embeddings.shape == (2, 384)
    assert np.allclose(
        index.embeddings, np.eye(3, 384, dtype=np.float32)[[0, 2]]
    )  # rows follow their entries
    assert {key.split(":")[0] for key in read_negatives(user.dir, CACHE_KEY)} == kept
    assert len(read_negatives(user.dir, CACHE_KEY)) == 4


def test_history_remove_forgets_the_item_in_the_exact_index_and_the_y_minus_cache() -> None:
    user, items = user_with_derived_files("ann")
    assert {"exact-index.safetensors", "history.jsonl", NEGATIVES_FILE} <= set(
        files_holding(user, "ZQXSECRET")
    )
    result = CliRunner().invoke(app, ["history", "remove", items[1].id[:8], "--user", "ann"])
    assert result.exit_code == 0, result.output
    assert_only_the_others_are_left(user, items)


def test_the_tuis_remove_forgets_it_too() -> None:
    user, items = user_with_derived_files("bob")
    remove_history_item(user, items[1].id)
    assert_only_the_others_are_left(user, items)


def test_nothing_is_rewritten_when_nothing_was_removed_and_a_damaged_index_is_deleted() -> None:
    """A damaged index was left to the rewrite; it cannot be pruned and may hold the removed item's text, so a
    removal deletes it (the next `fit --method exact` builds it again; audit85)."""
    user, _ = user_with_derived_files("cay")
    assert forget_removed_items(user) == []
    index_path(user).write_bytes(b"not a safetensors file")
    user.save_history(user.history()[:1])
    assert forget_removed_items(user) == [NEGATIVES_FILE, index_path(user).name]  # the y- cache pruned
    assert not index_path(user).exists()


def test_the_refit_advice_names_cope_only_for_a_user_with_a_cope_adapter() -> None:
    user, items = user_with_derived_files("dee")
    first = CliRunner().invoke(app, ["history", "remove", items[0].id[:8], "--user", "dee"])
    assert "--method cope" not in first.output
    (user.dir / "cope.json").write_text("{}", encoding="utf-8")
    second = CliRunner().invoke(app, ["history", "remove", items[2].id[:8], "--user", "dee"])
    assert "`localpers fit --method cope --user dee`" in second.output, second.output


def test_a_removed_items_input_stays_indexed_for_another_item_that_shares_it() -> None:
    """Of two items with one input the fit indexes the one with the larger margin; removing it dropped the input
    from the index although the other item remained (seventy-eighth session's review; mended in the
    seventy-ninth): the other item's search, in the selection cache, takes its place, as a refit would."""
    from localpers.methods import exact_cache

    user = UserStore().create("eve")
    shared = "The council votes on the new tram line tonight."
    best, other, negative = (
        HistoryItem.create("headline", shared, "TRAM VOTE TONIGHT!!!"),
        HistoryItem.create("headline", shared, "Tram Line Faces Vote"),
        HistoryItem.create("headline", "Rain is expected all week.", "Wet Week Ahead"),
    )
    lone = HistoryItem.create("headline", "Rain is expected all week, again.", "Wetter Still")
    user.save_history([best, other, negative, lone])
    meta = {"bundle_sha256": "b" * 64, "adapter": "cluster-0", "k": 2, "library": ["Base", "Formal"]}
    meta["fitted_by"] = "localpers test"
    entries = [
        IndexEntry(best.id, "headline", shared, ["Formal"], 0.9, 0.2),
        IndexEntry(negative.id, "headline", negative.input, ["Base"], 0.5, 0.1),
    ]
    embeddings = np.eye(2, 384, dtype=np.float32)
    ExactIndex(entries, embeddings, meta).save(index_path(user))
    key = exact_cache.selections_key(
        meta["bundle_sha256"], "cluster-0", 2, meta["library"], meta["fitted_by"]
    )
    records = {
        best.id: exact_cache.SelectionRecord("d1", ("Formal",), 0.9, 0.2),
        other.id: exact_cache.SelectionRecord("d2", ("Base", "Formal"), 0.6, 0.2),
        negative.id: exact_cache.SelectionRecord("d3", ("Base",), 0.5, 0.1),
        lone.id: exact_cache.SelectionRecord("d4", ("Base",), 0.3, 0.1),
    }
    assert exact_cache.write_selections(user.dir, key, records)

    result = CliRunner().invoke(app, ["history", "remove", best.id[:8], "--user", "eve"])
    assert result.exit_code == 0, result.output
    index = load_index(user)
    assert [(e.item_id, e.attributes, e.margin) for e in index.entries] == [
        (other.id, ["Base", "Formal"], 0.6),  # in the removed entry's place, with the shared input's row
        (negative.id, ["Base"], 0.5),
    ]
    assert np.allclose(index.embeddings, np.eye(2, 384, dtype=np.float32))

    # a remaining duplicate whose attributes lowered its margin stays out, as the fit's gain filter leaves it
    records[other.id] = exact_cache.SelectionRecord("d2", ("Base",), 0.1, 0.2)
    exact_cache.write_selections(user.dir, key, {k: v for k, v in records.items() if k != best.id})
    duplicate = HistoryItem.create("headline", negative.input, "Rain, Rain, Rain")
    user.save_history([*user.history(), duplicate])
    records[duplicate.id] = exact_cache.SelectionRecord("d5", ("Base",), 0.05, 0.1)
    exact_cache.write_selections(user.dir, key, {k: v for k, v in records.items() if k != best.id})
    removed = CliRunner().invoke(app, ["history", "remove", negative.id[:8], "--user", "eve"])
    assert removed.exit_code == 0, removed.output
    assert [e.item_id for e in load_index(user).entries] == [other.id]


def test_a_removed_items_input_is_not_taken_over_by_another_tasks_item() -> None:
    """The index is per task and input (retrieval keeps to one task): removing a title item whose input another,
    unindexed paraphrase item shares put the paraphrase's search in the title's place (audit90 #1), an entry
    retrieved for titles from a paraphrase pair."""
    from localpers.methods import exact_cache

    user = UserStore().create("fay")
    shared = "The council voted to halve bus fares from next month."
    title = HistoryItem.create("title", shared, "Fares Halved")
    paraphrase = HistoryItem.create(
        "paraphrase", shared, "Bus tickets will cost half as much from next month."
    )
    other = HistoryItem.create("title", "Rain is expected all week.", "Wet Week Ahead")
    user.save_history([title, paraphrase, other])
    meta = {"bundle_sha256": "b" * 64, "adapter": "cluster-0", "k": 1, "library": ["Base", "Formal"]}
    meta["fitted_by"] = "localpers test"
    entries = [
        IndexEntry(title.id, "title", shared, ["Formal"], 0.9, 0.2),
        IndexEntry(other.id, "title", other.input, ["Base"], 0.5, 0.1),
    ]
    ExactIndex(entries, np.eye(2, 384, dtype=np.float32), meta).save(index_path(user))
    key = exact_cache.selections_key(
        meta["bundle_sha256"], "cluster-0", 1, meta["library"], meta["fitted_by"]
    )
    records = {
        title.id: exact_cache.SelectionRecord("d1", ("Formal",), 0.9, 0.2),
        paraphrase.id: exact_cache.SelectionRecord("d2", ("Base",), 0.6, 0.2),
        other.id: exact_cache.SelectionRecord("d3", ("Base",), 0.5, 0.1),
    }
    assert exact_cache.write_selections(user.dir, key, records)

    result = CliRunner().invoke(app, ["history", "remove", title.id[:8], "--user", "fay"])
    assert result.exit_code == 0, result.output
    index = load_index(user)
    assert [(e.item_id, e.task) for e in index.entries] == [(other.id, "title")]
    assert np.allclose(index.embeddings, np.eye(2, 384, dtype=np.float32)[[1]])


def test_a_remove_stopped_midway_leaves_no_removed_text_that_nothing_would_prune(monkeypatch) -> None:
    # before, the history was written first: a stop while the derived files were pruned left the removed input
    # in EXACT's index, and a second `history remove` found no such item to remove
    import localpers.methods.forget as forget

    user, items = user_with_derived_files("eve")
    original = forget.forget_removed_items
    stops = iter([True])

    def stopped_once(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if next(stops, False):
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(forget, "forget_removed_items", stopped_once)
    first = CliRunner().invoke(app, ["history", "remove", items[1].id[:8], "--user", "eve"])
    assert first.exit_code == 130
    if any(item.id == items[1].id for item in user.history()):  # the stop came before the history changed
        again = CliRunner().invoke(app, ["history", "remove", items[1].id[:8], "--user", "eve"])
        assert again.exit_code == 0, again.output
    assert_only_the_others_are_left(user, items)
