"""Cases the ninety-first session's mutation round found untested (each let a changed line pass every test).

An export's files must leave the archive room for its manifest: a user whose files filled the archive's whole
bound wrote an archive no import would take back.
"""

from __future__ import annotations

import pytest

from localpers.errors import LocalpersError
from localpers.users.archive import MAX_ARCHIVE_MEMBER_BYTES, MAX_ARCHIVE_TOTAL_BYTES, pack_archive

MANIFEST_ROOM = 1 << 20


def test_an_export_keeps_a_mebibyte_of_the_archives_bound_for_its_manifest() -> None:
    room_for_files = MAX_ARCHIVE_TOTAL_BYTES - MANIFEST_ROOM
    history = b"\n" * MAX_ARCHIVE_MEMBER_BYTES
    fits = {"history.jsonl": history, "state.json": b" " * (room_for_files - len(history))}
    assert pack_archive("ann", 0, fits)[:2] == b"PK"
    over = {"history.jsonl": history, "state.json": b" " * (room_for_files - len(history) + 1)}
    with pytest.raises(LocalpersError, match="more than the .* bytes an archive can hold"):
        pack_archive("ann", 0, over)


def write_lines(path, *records) -> None:
    import json

    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def test_a_history_file_is_refused_in_one_line_for_each_field_a_survivor_left_unchecked(tmp_path) -> None:
    """history_import's checks of --keep-latest's upper bound, the default task, an empty user_id and a 'history'
    that is no list each survived a mutant: every line still parsed."""
    from localpers.errors import InputError
    from localpers.users.history import MAX_HISTORY_ITEMS
    from localpers.users.history_import import parse_history

    plain = tmp_path / "plain.jsonl"
    write_lines(plain, {"input": "An article.", "output": "A Headline"})
    assert len(parse_history(plain, keep_latest=MAX_HISTORY_ITEMS).items) == 1
    with pytest.raises(InputError, match=rf"--keep-latest {MAX_HISTORY_ITEMS + 1}: choose 1 to"):
        parse_history(plain, keep_latest=MAX_HISTORY_ITEMS + 1)
    tasked = tmp_path / "tasked.jsonl"
    write_lines(tasked, {"task": "headline", "input": "An article.", "output": "A Headline"})
    for path in (plain, tasked):  # a bad default is refused even where every line names its own task
        with pytest.raises(InputError, match="unknown task 'limerick'; choose one of: headline"):
            parse_history(path, default_task="limerick")
    nameless = tmp_path / "nameless.jsonl"
    write_lines(nameless, {"user_id": "", "history": [{"input": "An article.", "output": "A Headline"}]})
    with pytest.raises(InputError, match="line 1: field 'user_id' must be a non-empty string or an integer"):
        parse_history(nameless)
    text = tmp_path / "text.jsonl"
    write_lines(text, {"user_id": "ann", "history": "An article. A Headline"})
    with pytest.raises(InputError, match="line 1: field 'history' must be a list of items"):
        parse_history(text)
    crowd = tmp_path / "crowd.jsonl"
    item = {"input": "An article.", "output": "A Headline"}
    write_lines(crowd, *({"user_id": f"u{n}", "history": [item]} for n in range(1, 8)))
    with pytest.raises(InputError, match=r"holds 7 users \(u1, u2, u3, u4, u5, \.\.\.\); choose one"):
        parse_history(crowd)


def test_a_number_past_a_floats_range_is_refused_where_nan_is() -> None:
    """`parse_json(allow_nan=False)` read 1e999 as infinity under two mutants (no test gave it such a number)."""
    from localpers.untrusted import JSONProblem, parse_json

    assert parse_json(b'{"loss": 1e999}') == {
        "loss": float("inf")
    }  # Python's own reading, where NaN is allowed
    for text in (b'{"loss": 1e999}', b"[-1e400]"):
        with pytest.raises(JSONProblem, match="is out of range"):
            parse_json(text, allow_nan=False)
    assert parse_json(b'{"loss": 1.5e308}', allow_nan=False) == {"loss": 1.5e308}


def test_atomic_writes_name_a_too_long_name_replace_a_link_itself_and_a_cache_never_fails(tmp_path) -> None:
    """Three survivors in atomic.py: the mend for a name too long, `through_link` off by default (the link is
    replaced, never what it points to), and a cache's write over a folder (a plain LocalpersError) read as False."""
    import os

    from localpers.atomic import atomic_write_text, write_cache_bytes
    from localpers.errors import StorageError

    with pytest.raises(StorageError, match="choose a shorter name"):
        atomic_write_text(tmp_path / ("n" * 300), "text")
    target = tmp_path / "target.txt"
    target.write_text("kept")
    link = tmp_path / "link.txt"
    os.symlink(target, link)
    atomic_write_text(link, "new")
    assert not link.is_symlink() and link.read_text() == "new" and target.read_text() == "kept"
    (tmp_path / "cache.bin").mkdir()
    assert write_cache_bytes(tmp_path / "cache.bin", b"data") is False


def test_one_line_keeps_the_invisible_marks_of_writing_and_cuts_one_past_its_limit() -> None:
    from localpers.untrusted import one_line

    for kept in ("❤\ufe0f", "co\u00adoperate", "\u0915\u094d\u200d\u0937", "\u2764\ufe0e"):
        assert one_line(kept) == kept
    assert one_line("abcd", limit=3) == "abc..." and one_line("abc", limit=3) == "abc"
    assert one_line("a\nb\x1b") == "a\\nb\\x1b"


def test_strict_json_writes_a_nan_inside_a_tuple_as_null() -> None:
    from localpers.strict_json import strict_json_text

    assert strict_json_text({"pair": (1.0, float("nan")), "list": [float("inf")]}) == (
        '{"pair": [1.0, null], "list": [null]}'
    )
