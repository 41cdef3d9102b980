"""History parsing: the three input formats, line-numbered errors, duplicates, the item limit."""

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localpers.errors import LocalpersError
from localpers.users.history import (
    MAX_HISTORY_ITEMS,
    HistoryItem,
    demo_history_path,
    item_id,
    merge_history,
    normalize_text,
    read_stored_history,
    serialize_history,
)
from localpers.users.history_import import parse_history, parse_history_file

SHARED_TEST = Path(__file__).resolve().parents[2] / "shared" / "data" / "news-headlines" / "test.jsonl"


def write_lines(path: Path, lines: list[object]) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def test_plain_items_default_to_headline_and_are_normalised(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "h.jsonl",
        [
            {"input": "  An   article\tabout cats ", "output": "Cats  Win\r\n"},
            "",
            {"input": "b", "output": "B"},
        ],
    )
    items = parse_history_file(path)
    assert [(i.task, i.input, i.output) for i in items] == [
        ("headline", "An article about cats", "Cats Win"),
        ("headline", "b", "B"),
    ]
    assert items[0].source == "h.jsonl:1" and items[1].source == "h.jsonl:3"
    assert items[0].id == item_id("headline", "An article about cats", "Cats Win")


def test_task_field_and_default_task(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "h.jsonl", [{"task": "title", "input": "x", "output": "X"}, {"input": "y", "output": "Y"}]
    )
    items = parse_history_file(path, default_task="paraphrase")
    assert [i.task for i in items] == ["title", "paraphrase"]


def shared_user(uid: str, n: int) -> dict:
    history = [
        {"id": f"n{k}", "input": f"article {uid} {k}", "output": f"Headline {k}", "date": "2020-01-01"}
        for k in range(n)
    ]
    return {"user_id": uid, "history": history, "queries": [{"input": "secret query", "output": "Q"}]}


def test_shared_user_format_single_user(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "u.jsonl", [shared_user("u1", 3)])
    items = parse_history_file(path)
    assert [i.output for i in items] == ["Headline 0", "Headline 1", "Headline 2"]
    assert items[0].source == "u.jsonl:u1/n0"
    assert all("secret" not in i.input for i in items)  # queries are never taken


def test_shared_user_format_several_users_needs_user_id(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "u.jsonl", [shared_user("u1", 2), shared_user("u2", 4)])
    with pytest.raises(LocalpersError, match=r"holds 2 users \(u1, u2\); choose one with --user-id"):
        parse_history_file(path)
    assert len(parse_history_file(path, user_id="u2")) == 4
    with pytest.raises(LocalpersError, match="has no user_id 'u9'"):
        parse_history_file(path, user_id="u9")


def test_numbered_authors_are_read_as_publish_and_bench_read_them(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "u.jsonl", [{**shared_user("u1", 2), "user_id": 7}, shared_user("u2", 3)])
    assert len(parse_history_file(path, user_id="7")) == 2
    path = write_lines(
        tmp_path / "v.jsonl",
        [{**shared_user("u1", 2), "user_id": 7}, {**shared_user("u2", 1), "user_id": "7"}],
    )
    with pytest.raises(LocalpersError, match="line 2: user_id '7' already appeared on line 1"):
        parse_history_file(path)
    path = write_lines(tmp_path / "w.jsonl", [{**shared_user("u1", 2), "user_id": True}])
    with pytest.raises(LocalpersError, match="field 'user_id' must be a non-empty string or an integer"):
        parse_history_file(path)


def test_user_id_on_a_plain_file_and_mixed_formats_are_refused(tmp_path: Path) -> None:
    plain = write_lines(tmp_path / "p.jsonl", [{"input": "a", "output": "A"}])
    with pytest.raises(LocalpersError, match="--user-id applies only"):
        parse_history_file(plain, user_id="u1")
    mixed = write_lines(tmp_path / "m.jsonl", [shared_user("u1", 1), {"input": "a", "output": "A"}])
    with pytest.raises(LocalpersError, match=r"m.jsonl line 2: a plain item in a file of per-user lines"):
        parse_history_file(mixed)


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"input": "a"}', r"line 3: missing field 'output'"),
        ('{"input": "a", "output": 5}', r"line 3: field 'output' must be a string"),
        ('{"input": "a", "output": "   "}', r"line 3: field 'output' is empty"),
        ('{"input": "a", "output": "b", "task": "poem"}', r"line 3: unknown task 'poem'"),
        ('{"input": "a", "output": "b"', r"line 3: not valid JSON"),
        ('["a", "b"]', r"line 3: expected a JSON object, got list"),
    ],
)
def test_errors_name_file_and_line(tmp_path: Path, bad_line: str, message: str) -> None:
    path = write_lines(tmp_path / "bad.jsonl", [{"input": "ok", "output": "OK"}, "", bad_line])
    with pytest.raises(LocalpersError, match=message) as raised:
        parse_history_file(path)
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_errors_inside_a_shared_user_line_name_the_item(tmp_path: Path) -> None:
    record = shared_user("u1", 3)
    del record["history"][1]["output"]
    path = write_lines(tmp_path / "u.jsonl", [record])
    with pytest.raises(LocalpersError, match=r"line 1 \(user u1\) history item 2: missing field 'output'"):
        parse_history_file(path)


def test_a_shared_user_line_with_an_empty_history_is_refused_as_an_empty_file_is(tmp_path: Path) -> None:
    """It imported nothing and exited 0 ("imported 0 items"), while an empty plain file is refused (audit88)."""
    path = write_lines(tmp_path / "u.jsonl", [shared_user("u1", 2), {"user_id": "u2", "history": []}])
    with pytest.raises(LocalpersError, match=r"line 2 \(user u2\) has no history items") as raised:
        parse_history_file(path, user_id="u2")
    assert str(path) in str(raised.value) and raised.value.exit_code == 2
    assert len(parse_history_file(path, user_id="u1")) == 2


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(LocalpersError, match="no such file"):
        parse_history_file(tmp_path / "absent.jsonl")
    (tmp_path / "latin1.jsonl").write_bytes(
        b'{"input": "a", "output": "b"}\n{"input": "caf\xe9", "output": "b"}\n'
    )
    with pytest.raises(LocalpersError, match="line 2: not UTF-8"):
        parse_history_file(tmp_path / "latin1.jsonl")
    (tmp_path / "blank.jsonl").write_text("\n  \n")
    with pytest.raises(LocalpersError, match="has no history items"):
        parse_history_file(tmp_path / "blank.jsonl")


def test_duplicates_are_reported_and_skipped(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "d.jsonl",
        [
            {"input": "a", "output": "A"},
            {"input": "b", "output": "B"},
            {"input": " a ", "output": "A  "},  # same text once whitespace is normalised
            {"task": "title", "input": "a", "output": "A"},  # another task: not a duplicate
        ],
    )
    parsed = parse_history(path)
    assert [i.output for i in parsed.items] == ["A", "B", "A"]
    assert [(d.where, d.first_seen) for d in parsed.duplicates] == [("line 3", "line 1")]
    assert parsed.duplicates[0].item_id == parsed.items[0].id


def test_item_limit(tmp_path: Path) -> None:
    lines = [{"input": f"article {k}", "output": f"Headline {k}"} for k in range(MAX_HISTORY_ITEMS)]
    assert len(parse_history_file(write_lines(tmp_path / "ok.jsonl", lines))) == MAX_HISTORY_ITEMS
    lines.append({"input": "one more", "output": "Too Many"})
    with pytest.raises(
        LocalpersError, match=f"501 history items, more than the limit of {MAX_HISTORY_ITEMS}"
    ):
        parse_history_file(write_lines(tmp_path / "big.jsonl", lines))


def test_keep_latest_takes_a_long_files_last_unique_items_and_still_validates_every_line(
    tmp_path: Path,
) -> None:
    lines = [{"input": f"article {k}", "output": f"Headline {k}"} for k in range(MAX_HISTORY_ITEMS + 100)]
    lines.insert(3, lines[-1])  # a duplicate counts once, where it first appears
    path = write_lines(tmp_path / "archive.jsonl", lines)
    with pytest.raises(LocalpersError, match="or import its latest with --keep-latest 500"):
        parse_history(path)
    parsed = parse_history(path, keep_latest=MAX_HISTORY_ITEMS)
    assert len(parsed.items) == MAX_HISTORY_ITEMS and parsed.older_left_out == 100
    outputs = [item.output for item in parsed.items]
    assert outputs[0] == "Headline 99" and outputs[-1] == f"Headline {MAX_HISTORY_ITEMS + 98}"
    assert f"Headline {MAX_HISTORY_ITEMS + 99}" not in outputs  # first seen on line 4, among the oldest
    short = parse_history(write_lines(tmp_path / "short.jsonl", lines[:5]), keep_latest=10)
    assert len(short.items) == 5 and short.older_left_out == 0
    with pytest.raises(LocalpersError, match="archive.jsonl line 602: missing field 'output'"):
        parse_history(write_lines(tmp_path / "archive.jsonl", [*lines, {"input": "x"}]), keep_latest=5)
    with pytest.raises(LocalpersError, match="--keep-latest 0: choose 1 to 500"):
        parse_history(path, keep_latest=0)


def test_ids_are_stable_and_distinguish_fields() -> None:
    first = HistoryItem.create("headline", "x  y", "Z")
    assert first.id == HistoryItem.create("headline", "x y", " Z").id
    assert len({first.id, item_id("title", "x y", "Z"), item_id("headline", "x y", "z")}) == 3
    assert normalize_text("a\n\n\n\nb  c ") == "a\n\nb c"


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=40))
def test_normalizing_normalized_text_changes_nothing(text: str) -> None:
    once = normalize_text(text)
    assert normalize_text(once) == once


def test_an_items_id_is_the_one_it_reads_back_with(tmp_path: Path) -> None:
    """A control character between a letter and its accent: removed after NFC, it left the two apart, and reading
    the stored item back composed them: `history add` printed an id that `history remove` did not know (store
    audit, eighty-fourth session)."""
    item = HistoryItem.create("headline", "An article.", "Cafe\x01\u0301 opens")
    assert item.output == "Caf\u00e9 opens"
    path = tmp_path / "history.jsonl"
    path.write_text(serialize_history([item]), encoding="utf-8")
    assert [stored.id for stored in read_stored_history(path)] == [item.id]


def test_merge_and_stored_round_trip(tmp_path: Path) -> None:
    a, b, c = (HistoryItem.create("headline", s, s.upper(), "t") for s in "abc")
    merged, skipped = merge_history([a, b], [b, c])
    assert merged == [a, b, c] and skipped == [b]
    stored = tmp_path / "history.jsonl"
    stored.write_text(serialize_history(merged))
    assert read_stored_history(stored) == merged
    assert read_stored_history(tmp_path / "none.jsonl") == []


def test_damaged_stored_history_names_the_file_and_the_fix(tmp_path: Path) -> None:
    stored = tmp_path / "history.jsonl"
    stored.write_text(serialize_history([HistoryItem.create("headline", "a", "A")]) + "{oops\n")
    with pytest.raises(LocalpersError, match=r"history.jsonl line 2: not valid JSON .*remove the file"):
        read_stored_history(stored)


def test_demo_history_is_a_valid_headline_history() -> None:
    items = parse_history_file(demo_history_path())
    assert 15 <= len(items) <= 30
    assert {i.task for i in items} == {"headline"}
    assert all(i.input.startswith("Generate a headline for the following article: ") for i in items)
    assert all(":" in i.output for i in items)  # the demo style: a verdict after a colon


@pytest.mark.skipif(not SHARED_TEST.exists(), reason="shared news-headlines data not present")
def test_shared_test_file_parses_per_user() -> None:
    with pytest.raises(LocalpersError, match="choose one with --user-id"):
        parse_history_file(SHARED_TEST)
    first = json.loads(SHARED_TEST.read_text().splitlines()[0])
    items = parse_history_file(SHARED_TEST, user_id=first["user_id"])
    assert 0 < len(items) <= len(first["history"])
    assert items[0].output == normalize_text(first["history"][0]["output"])


def test_import_refuses_what_the_tasks_prompts_cannot_carry_and_stored_items_still_read(
    tmp_path: Path,
) -> None:
    long_output = {"input": "An article.", "output": "word " * 100}
    with pytest.raises(
        LocalpersError, match=r"h.jsonl line 2: field 'output' has 499 characters; a headline"
    ):
        parse_history_file(write_lines(tmp_path / "h.jsonl", [{"input": "a", "output": "b"}, long_output]))
    long_passage = {"task": "paraphrase", "input": "word " * 300, "output": "A shorter passage."}
    with pytest.raises(
        LocalpersError, match=r"line 1: field 'input' has 1,499 characters; the paraphrase task"
    ):
        parse_history_file(write_lines(tmp_path / "p.jsonl", [long_passage]))
    # a headline's article may be long: its prompts read the article's start
    article = {"input": "The lede. " + "More of the article. " * 300, "output": "A Headline"}
    assert len(parse_history_file(write_lines(tmp_path / "a.jsonl", [article]))) == 1
    # items stored before the check are read as they are (the fit cuts them); only new items are refused
    stored = tmp_path / "history.jsonl"
    stored.write_text(serialize_history([HistoryItem.create("headline", "a", "word " * 100)]))
    assert len(read_stored_history(stored)) == 1
    with pytest.raises(ValueError, match="field 'output' has"):
        HistoryItem.create("headline", "a", "word " * 100, strict=True)


def test_a_json_error_ending_in_at_does_not_say_at_twice(tmp_path: Path) -> None:
    """json's "Unterminated string starting at" came out as "starting at at line 1 column 11"."""
    path = tmp_path / "h.jsonl"
    path.write_text('{"input": "a", "output": "A"}\n{"input": "unfinished\n')
    with pytest.raises(LocalpersError) as raised:
        parse_history_file(path)
    assert "line 2: not valid JSON (Unterminated string starting at line 1 column 11)" in str(raised.value)
    assert "at at" not in str(raised.value)


def test_a_new_item_of_only_invisible_characters_is_refused_as_rewrite_refuses_it() -> None:
    """A zero-width space was taken into the history (an empty `- ` line in every prompt), though `rewrite`
    calls the same text empty (text audit); stored items are read as they are."""
    for field, args in (("output", ("An article.", "\u200b")), ("input", ("\u200b\u2060", "A Headline"))):
        with pytest.raises(ValueError, match=f"field '{field}' holds only invisible characters"):
            HistoryItem.create("headline", *args, strict=True)
    assert HistoryItem.create("headline", "An article.", "\u200b").output == "\u200b"


def test_a_new_one_line_output_is_stored_on_one_line() -> None:
    """ "Rain\\r\\nexpected" was kept over two lines: a headline the model can never write, and a broken
    `--examples` listing (text audit). The free task keeps its lines; stored items are read as they are."""
    assert (
        HistoryItem.create("headline", "An article.", "Rain\r\n expected ", strict=True).output
        == "Rain expected"
    )
    assert HistoryItem.create("free", "A text.", "One.\nTwo.", strict=True).output == "One.\nTwo."
    assert HistoryItem.create("headline", "An article.", "Rain\nexpected").output == "Rain\nexpected"


def test_one_line_keeps_the_joiners_of_ordinary_writing() -> None:
    """`history list` showed a family emoji as 👨\\u200d👩 and Persian words with \\u200c (text audit)."""
    from localpers.untrusted import one_line

    family, persian = "Family 👨\u200d👩\u200d👧 wins", "کتابخانه\u200cای"
    assert one_line(family) == family and one_line(persian) == persian and one_line("❤\ufe0f") == "❤\ufe0f"
    assert (
        one_line("a\nb\x1b[31m\u202eevil") == "a\\nb\\x1b[31m\\u202eevil"
    )  # breaks and bidi overrides still


def test_a_dated_file_is_ordered_by_its_times_too_and_impossible_dates_count_as_none() -> None:
    from localpers.users.dates import oldest_first

    newest_first = [{"date": d} for d in ("2024-01-02T18:00Z", "2024-01-02T09:00Z", "2024-01-01T20:00+00:00")]
    ordered, moved = oldest_first(newest_first)
    assert moved and [entry["date"][:16] for entry in ordered] == [
        "2024-01-01T20:00",
        "2024-01-02T09:00",
        "2024-01-02T18:00",
    ]
    zoned = [{"date": "2024-01-02T09:00+05:00"}, {"date": "2024-01-02T05:00Z"}]  # 04:00 and 05:00 UTC
    assert oldest_first(zoned) == (zoned, False)
    impossible = [{"date": "2024-02-01"}, {"date": "2024-13-45"}]
    assert oldest_first(impossible) == (impossible, False)


def test_the_iso_forms_a_date_takes_and_a_clock_time_that_is_none() -> None:
    """A time after the day was dropped whenever Python could not read the whole text, so T25:30 read as midnight
    (audit88); a valid clock time is read, a zone name after it left, and a day followed by words is that day."""
    from datetime import UTC, datetime

    from localpers.users.dates import item_time

    def utc(*parts: int) -> datetime:
        return datetime(*parts, tzinfo=UTC)

    read = {
        "2024-01-01": utc(2024, 1, 1),
        "2024-01-01T23:00": utc(2024, 1, 1, 23),
        "2024-01-01T23:00:05Z": utc(2024, 1, 1, 23, 0, 5),
        "2024-01-01 23:00": utc(2024, 1, 1, 23),
        "2024-01-01T23:00:00+02:00": utc(2024, 1, 1, 21),
        "2024-01-01T23:00:00.250": utc(2024, 1, 1, 23, 0, 0, 250000),
        "2024-01-01T23:00:00,5Z": utc(2024, 1, 1, 23, 0, 0, 500000),
        "2024-01-01T2300": utc(2024, 1, 1, 23),
        "2024-05-02 09:00 UTC": utc(2024, 5, 2, 9),
        "2024-05-02 9:30": utc(2024, 5, 2, 9, 30),
        "2024-05-02T09:30:00.000Z[UTC]": utc(2024, 5, 2, 9, 30),
        "2024-05-02 (evening)": utc(2024, 5, 2),
    }
    assert {text: item_time({"date": text}) for text in read} == read
    for none in ("2024-01-01T25:30", "2024-01-01T10:00+25:00", "2024-01-01 10:00 -24:30", "2024-01-01T10:61"):
        assert item_time({"date": none}) is None, none
    for none in ("2024-01-01 12:30garbage", "2024-01-01 9:3", "2024-01-01garbage", "2024-13-45 10:00"):
        assert item_time({"date": none}) is None, none
    # a number after a space is words, not an hour; a zone other than UTC would be read hours off (session review)
    assert item_time({"date": "2024-05-02 3 pages"}) == utc(2024, 5, 2)
    for none in ("2024-01-01 09:30:00 GMT+2", "2024-01-01 09:30 CET", "2024-01-01T0930 x"):
        assert item_time({"date": none}) is None, none


def test_a_date_is_read_without_the_spaces_around_it_and_words_are_no_date() -> None:
    """Mutation round (ninety-first session): neither the spaces around a date nor a field that is no date at all
    was tested."""
    from localpers.users.dates import item_date, item_time

    assert item_date({"date": " 2024-05-02 "}) == "2024-05-02"
    assert item_date({"date": "\t2024-05-02T09:30Z\n"}) == "2024-05-02"
    for none in ("yesterday", "May 2, 2024", "02/05/2024", "", 20240502, None):
        assert item_date({"date": none}) is None, none
        assert item_time({"date": none}) is None, none
    assert item_date({"when": "2024-05-02"}) is None and item_date("2024-05-02") is None


def test_a_json_document_is_refused_with_the_jq_command_that_makes_it_jsonl(tmp_path: Path) -> None:
    """The hint's `jq -c '.[]'` turned `history list --json`'s object into its values: a name and a list."""
    items = [{"input": "An article.", "output": "A Headline"}]
    listed = tmp_path / "listed.json"
    listed.write_text(json.dumps({"user": "ann", "items": items}, indent=2))
    with pytest.raises(LocalpersError, match=re.escape("`jq -c '.items[]' FILE > items.jsonl`")):
        parse_history_file(listed)
    array = tmp_path / "array.json"
    array.write_text(json.dumps(items, indent=2))
    with pytest.raises(LocalpersError, match=re.escape("`jq -c '.[]' FILE > items.jsonl`")):
        parse_history_file(array)
