"""Cases the ninety-second session's mutation round found untested (each let a changed line pass every test).

History items: what `normalize_text` folds and what it keeps, the ids and digests earlier versions stored, the
bounds of a stored input and a stored history, the fields a line may not hold, a byte order mark and a raw U+2028
in a stored file, and which copy of a repeated line is read.

Series: an overlap of exactly `SIMILARITY` is alike, the overlap is the F1 of two word sets, single characters and
three-letter words ending in s are kept as they are, and the word index finds what comparing every pair finds at
a similarity whose bound is a float a hair above an integer.

Ordinals: a damaged history_ordinals.json (not JSON, not an object) reads as none, only non-negative integers are
ordinals, ordinals that do not increase are not used, and two items a hand edit gave one ordinal get increasing
ones on the next change.

Paths: LOCALPERS_HOME may start with ~, holds the cache, data and config folders apart and makes none of them when
asked not to; a LOCALPERS_HOME that cannot hold them is refused with the system's reason in words; a folder that
can be written but not entered is refused as one that cannot be written; a refused --out names its first three
entries by name.
"""

from __future__ import annotations

import codecs
import json
import os
from pathlib import Path

import pytest

from localpers import paths
from localpers.errors import InputError, LocalpersError
from localpers.paths import cache_dir, check_own_directory, config_dir, data_dir
from localpers.users import history
from localpers.users.history import (
    MAX_STORED_INPUT_CHARS,
    HistoryItem,
    history_digest,
    item_id,
    merge_history,
    normalize_text,
    read_stored_history,
    serialize_history,
)
from localpers.users.history_import import parse_history_file
from localpers.users.ordinals import ORDINALS_FILE, ordinals_of, read_ordinals
from localpers.users.series import (
    about_series,
    distinct_series,
    find_series,
    overlap,
    subject_words,
    word_set,
)
from localpers.users.store import UserStore


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("Line one\rLine two", "Line one\nLine two"),  # a classic Mac line break is a line break, not nothing
        ("Para one\n\n\nPara two", "Para one\n\nPara two"),
        ("Rain\xa0\xa0due\u3000today", "Rain due today"),  # every horizontal space, not only space and tab
    ],
    ids=["lone-cr", "three-newlines", "wide-spaces"],
)
def test_normalize_text_folds_line_breaks_and_horizontal_spaces(text: str, normal: str) -> None:
    assert normalize_text(text) == normal


def test_normalize_text_keeps_the_compatibility_forms_of_the_users_writing() -> None:
    """NFC, not NFKC: a superscript, a ligature, full-width letters and a circled digit are the writer's own."""
    text = "E = mc\u00b2: \ufb01x \uff23\uff41\uff46\u00e9 \u2460"
    assert normalize_text(text) == text


def test_item_ids_and_history_digests_are_the_ones_earlier_versions_stored() -> None:
    """An id is printed for `history remove`, kept in history_ordinals.json and the fit's caches, and a digest in
    fit.json: computed another way, every stored fit reads as stale and every cache misses."""
    french = HistoryItem.create("headline", "Le caf\u00e9 ouvre \u00e0 Z\u00fcrich.", "Caf\u00e9 \u00d6ffnet")
    plain = HistoryItem.create("title", "plain", "Plain")
    assert (french.id, plain.id) == ("36f011165f5b", "520adcce164a")
    assert item_id("headline", "Le caf\u00e9 ouvre \u00e0 Z\u00fcrich.", "Caf\u00e9 \u00d6ffnet") == french.id
    assert history_digest([french, plain]) == "40434fa75a41df9d"


def test_a_new_text_of_invisible_characters_and_spaces_between_them_is_refused() -> None:
    with pytest.raises(ValueError, match="field 'input' holds only invisible characters"):
        HistoryItem.create("headline", "\u200b \u200b", "A Headline", strict=True)
    with pytest.raises(ValueError, match="field 'output' holds only invisible characters"):
        HistoryItem.create("headline", "An article.", "\u200b \u2060", strict=True)


def test_a_new_items_input_may_hold_exactly_the_stored_limit() -> None:
    kept = HistoryItem.create("headline", "x" * MAX_STORED_INPUT_CHARS, "A Headline", strict=True)
    assert len(kept.input) == MAX_STORED_INPUT_CHARS
    with pytest.raises(ValueError, match=f"field 'input' has {MAX_STORED_INPUT_CHARS + 1:,} characters"):
        HistoryItem.create("headline", "x" * (MAX_STORED_INPUT_CHARS + 1), "A Headline", strict=True)


def test_a_history_of_exactly_the_file_limit_is_stored_and_a_longer_one_names_its_longest_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    long_input = HistoryItem.create("headline", "An article. " * 40, "Short")
    long_output = HistoryItem.create("headline", "Brief.", "A much longer headline than any other " * 4)
    items = [long_output, long_input]
    size = len(serialize_history(items).encode("utf-8"))
    user = UserStore().create("ann")
    monkeypatch.setattr(history, "MAX_HISTORY_FILE_BYTES", size)
    user.save_history(items)
    assert user.history() == items
    monkeypatch.setattr(history, "MAX_HISTORY_FILE_BYTES", size - 1)
    with pytest.raises(InputError) as refused:
        UserStore().create("bob").save_history(items)
    message = str(refused.value)
    assert f"would be {size:,} bytes, more than the {size - 1:,} a history may hold" in message
    assert f"the longest, item {long_input.id}, has {len(long_input.input):,} characters of input" in message


def test_merging_skips_a_new_item_given_twice_after_taking_it_once() -> None:
    a, b, c = (HistoryItem.create("headline", text, text.upper()) for text in ("a", "b", "c"))
    assert merge_history([a], [b, b, c]) == ([a, b, c], [b])


def test_a_line_repeated_in_a_stored_history_is_read_where_and_as_it_first_appears(tmp_path: Path) -> None:
    first = HistoryItem.create("headline", "An article.", "A Headline", "import.jsonl:1")
    again = HistoryItem.create("headline", "An article.", "A Headline", "tui")
    other = HistoryItem.create("headline", "Another.", "Another Headline")
    path = tmp_path / "history.jsonl"
    path.write_text(serialize_history([first, other, again]), encoding="utf-8")
    assert read_stored_history(path) == [first, other]


def test_a_stored_items_source_must_be_a_string(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text(json.dumps({"input": "An article.", "output": "A Headline", "source": 7}) + "\n")
    with pytest.raises(
        InputError, match=r"history.jsonl line 1: field 'source' must be a string; fix or delete that line"
    ):
        read_stored_history(path)


@pytest.mark.parametrize(
    ("task", "message"),
    [
        (None, "field 'task' must be a string"),
        (["headline"], "field 'task' must be a string"),
        ("", "unknown task ''; choose one of: headline"),
    ],
)
def test_a_lines_task_that_is_no_task_name_is_refused_not_read_as_the_default(
    tmp_path: Path, task: object, message: str
) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"task": task, "input": "An article.", "output": "A Headline"}) + "\n")
    with pytest.raises(LocalpersError, match=rf"mine.jsonl line 1: {message}"):
        parse_history_file(path)


def test_a_stored_history_saved_with_a_byte_order_mark_reads_its_first_line(tmp_path: Path) -> None:
    item = HistoryItem.create("headline", "An article.", "A Headline")
    path = tmp_path / "history.jsonl"
    path.write_bytes(codecs.BOM_UTF8 + serialize_history([item]).encode("utf-8"))
    assert read_stored_history(path) == [item]


def test_a_stored_source_holding_a_line_separator_reads_back_as_one_item(tmp_path: Path) -> None:
    """An imported file's name is kept as its items' source, U+2028 and all, and json.dumps writes it raw."""
    item = HistoryItem.create("headline", "An article.", "A Headline", "notes\u2028old.jsonl:1")
    path = tmp_path / "history.jsonl"
    path.write_text(serialize_history([item]), encoding="utf-8")
    assert "\u2028" in path.read_text(encoding="utf-8")
    assert read_stored_history(path) == [item]


def test_outputs_whose_overlap_is_exactly_the_similarity_make_a_series() -> None:
    outputs = ["Top Films", "Top Books", "Top Games"]  # each pair shares one of two words: F1 0.5
    assert find_series(outputs, [0]) == [0, 1, 2]
    assert distinct_series(outputs) == [[0, 1, 2]]


def test_overlap_is_the_f1_of_the_two_word_sets() -> None:
    assert overlap(word_set("Top Films"), word_set("Top Films Of May")) == pytest.approx(2 / 3)
    assert overlap(word_set("Top Films"), word_set("Best Books")) == 0.0


def test_single_characters_and_three_letter_words_ending_in_s_are_kept_as_they_are() -> None:
    assert subject_words("Gas and bus fares go up, plan B") == frozenset({"gas", "bus", "fare", "go", "plan"})
    assert not about_series("Vitamin B for everyone", ["Plan B: a week of naps"], history_size=10)


def test_the_word_index_finds_a_series_where_the_bound_on_shared_words_is_a_hair_above_an_integer() -> None:
    """0.8 * 3 / 1.2 is 2.0000000000000004 in floating point: rounded up without a margin it asks for 3 shared
    words, and the index looks at one word too few and misses the two-word output sharing two of three (F1 0.8)."""
    outputs = ["cats nap", "week cats nap roundup", "week cats nap"]
    assert find_series(outputs, [2], similarity=0.8) == [0, 1, 2]
    assert distinct_series(outputs, similarity=0.8) == [[0, 1, 2]]


def items_about(*topics: str) -> list[HistoryItem]:
    return [
        HistoryItem.create("headline", f"A story about the {topic}.", f"{topic.title()} News")
        for topic in topics
    ]


@pytest.mark.parametrize("damaged", ["{oops", "[]", '"ordinals"'])
def test_an_ordinals_file_that_is_no_json_object_reads_as_none_and_the_next_change_mends_it(
    damaged: str,
) -> None:
    user = UserStore().create("ann")
    items = items_about("rail", "bakery", "river")
    user.save_history(items)
    (user.dir / ORDINALS_FILE).write_text(damaged)
    assert read_ordinals(user.dir) == {}
    assert ordinals_of(user.dir, items) is None
    user.save_history(items[1:])
    assert ordinals_of(user.dir, items[1:]) == [1, 2]


def test_only_non_negative_integers_are_read_as_ordinals() -> None:
    user = UserStore().create("ann")
    flag, negative, fraction, kept = items_about("rail", "bakery", "river", "school")
    stored = {flag.id: True, negative.id: -1, fraction.id: 1.0, kept.id: 2}
    (user.dir / ORDINALS_FILE).write_text(json.dumps({"version": 1, "ordinals": stored}))
    assert read_ordinals(user.dir) == {kept.id: 2}


def test_two_items_a_hand_edit_gave_one_ordinal_get_increasing_ones_on_the_next_change() -> None:
    user = UserStore().create("ann")
    first, second = items_about("rail", "bakery")
    for by_hand in ({first.id: 0, second.id: 0}, {first.id: 1, second.id: 0}):
        (user.dir / ORDINALS_FILE).write_text(json.dumps({"version": 1, "ordinals": by_hand}))
        assert ordinals_of(user.dir, [first, second]) is None  # the fit counts by position meanwhile
    (user.dir / ORDINALS_FILE).write_text(json.dumps({"version": 1, "ordinals": {first.id: 0, second.id: 0}}))
    user.save_history([first, second])
    assert ordinals_of(user.dir, [first, second]) == [0, 1]


def test_localpers_home_starting_with_a_tilde_is_under_the_home_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    monkeypatch.setenv("LOCALPERS_HOME", "~/portable")
    assert data_dir(create=False) == tmp_path / "me" / "portable" / "data"


def test_localpers_home_holds_cache_data_and_config_apart_and_makes_them_only_when_asked(
    localpers_home: Path,
) -> None:
    places = {"cache": cache_dir, "data": data_dir, "config": config_dir}
    for name, place in places.items():
        assert place(create=False) == localpers_home / name
        assert not (localpers_home / name).exists(), name
    for name, place in places.items():
        assert place() == localpers_home / name and (localpers_home / name).is_dir()


def test_a_localpers_home_that_cannot_hold_folders_is_refused_with_the_systems_reason(
    localpers_home: Path,
) -> None:
    localpers_home.parent.mkdir(parents=True, exist_ok=True)
    localpers_home.write_text("a file\n")
    with pytest.raises(LocalpersError) as refused:
        data_dir()
    assert str(refused.value) == (
        f"LOCALPERS_HOME={localpers_home} cannot hold localpers' folders (Not a directory: {localpers_home / 'data'});"
        " point it at a folder you can write in, or unset it"
    )


def test_an_out_folder_that_can_be_written_but_not_entered_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files are made in a folder only with its search (x) permission too; tests run as root, so it is faked."""
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access

    def access(path: object, mode: int, **options: object) -> bool:
        return not (Path(str(path)) == locked and mode & os.X_OK) and real_access(path, mode, **options)

    monkeypatch.setattr(paths.os, "access", access)
    for out in (locked, locked / "run"):
        with pytest.raises(
            LocalpersError, match=r"cannot be written \(its permissions, or a read-only file system\)"
        ):
            check_own_directory(
                out,
                option="--out",
                writer="a benchmark",
                replaces="a run replaces its report",
                is_ours=lambda _: True,
            )


def test_a_refused_out_folder_names_its_first_three_entries_by_name_and_counts_the_rest(
    tmp_path: Path,
) -> None:
    def refusal(directory: Path) -> str:
        with pytest.raises(LocalpersError) as refused:
            check_own_directory(
                directory,
                option="--out",
                writer="a benchmark",
                replaces="a run replaces its report",
                is_ours=lambda _: False,
            )
        return str(refused.value)

    three, five = tmp_path / "three", tmp_path / "five"
    for directory, names in ((three, "cab"), (five, "edcba")):
        directory.mkdir()
        for name in names:
            (directory / f"{name}.txt").write_text("mine\n")
    assert refusal(three) == (
        f"--out {three} already holds files a benchmark did not write (a.txt, b.txt, c.txt); a run replaces its"
        " report: give a new or empty directory"
    )
    assert "did not write (a.txt, b.txt, c.txt and 2 more); " in refusal(five)
