"""Corpus validation: good files load, bad ones fail with one line naming the file and line."""

from __future__ import annotations

import codecs
import json
import re
from pathlib import Path

import pytest

from localpers.errors import LocalpersError
from localpers.publish.corpus import load_corpus

GOOD_USER = {"user_id": "a", "history": [{"input": "in", "output": " Out "}], "queries": [{"input": "x"}]}


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_loads_users_items_and_ignores_queries(tmp_path: Path) -> None:
    second = {"user_id": 7, "history": [{"input": "i1", "output": "o1"}, {"input": "i2", "output": "o2"}]}
    corpus = load_corpus(write_lines(tmp_path / "c.jsonl", [json.dumps(GOOD_USER), "", json.dumps(second)]))
    assert [u.user_id for u in corpus.users] == ["a", "7"]
    assert corpus.n_items == 3
    assert corpus.users[0].history[0].output == "Out"
    assert corpus.users[1].line == 3


@pytest.mark.parametrize(
    ("second_line", "expected"),
    [
        ("{not json", r"c\.jsonl:2: not valid JSON"),
        ("[1, 2]", r"c\.jsonl:2: expected a JSON object"),
        (json.dumps({"history": []}), r"c\.jsonl:2: missing field 'user_id'"),
        (json.dumps({"user_id": "b"}), r"c\.jsonl:2: user 'b' has no 'history'"),
        (json.dumps({"user_id": "b", "history": {}}), r"c\.jsonl:2: field 'history' must be a list"),
        (json.dumps({"user_id": "b", "history": []}), r"c\.jsonl:2: user 'b' has an empty history"),
        (
            json.dumps({"user_id": "b", "history": [{"input": "x"}]}),
            r"c\.jsonl:2: history\[0\]: missing field 'output'",
        ),
        (
            json.dumps({"user_id": "b", "history": [{"input": "x", "output": 3}]}),
            r"c\.jsonl:2: history\[0\]: field 'output' must be a string",
        ),
        (
            json.dumps({"user_id": "b", "history": [{"input": "  ", "output": "y"}]}),
            r"c\.jsonl:2: history\[0\]: field 'input' is empty",
        ),
        (json.dumps(GOOD_USER), r"c\.jsonl:2: user_id 'a' already appears on line 1"),
    ],
)
def test_bad_lines_name_file_line_and_field(tmp_path: Path, second_line: str, expected: str) -> None:
    path = write_lines(tmp_path / "c.jsonl", [json.dumps(GOOD_USER), second_line])
    with pytest.raises(LocalpersError, match=expected) as caught:
        load_corpus(path)
    assert "\n" not in str(caught.value)


def test_missing_file_and_too_few_users(tmp_path: Path) -> None:
    with pytest.raises(LocalpersError, match="does not exist"):
        load_corpus(tmp_path / "absent.jsonl")
    with pytest.raises(LocalpersError, match=r"corpus file .* is a directory; give a JSONL file"):
        load_corpus(tmp_path)
    path = write_lines(tmp_path / "c.jsonl", [json.dumps(GOOD_USER)])
    with pytest.raises(LocalpersError, match="1 user\\(s\\) found, at least 2 needed"):
        load_corpus(path, min_users=2)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"user_id": "\xff"}\n')
    with pytest.raises(LocalpersError, match="not UTF-8"):
        load_corpus(path)


def test_not_utf8_names_the_line(tmp_path: Path) -> None:
    """A Latin-1 byte on line 3 named the file only (a corpus has thousands of lines); lines end as the parser
    counts them, at \\r\\n or a lone \\r too."""
    path = tmp_path / "latin1.jsonl"
    good = json.dumps(GOOD_USER).encode()
    path.write_bytes(good + b"\r\n" + good.replace(b'"a"', b'"b"', 1) + b'\r{"user_id": "Andr\xe9"}\n')
    with pytest.raises(
        LocalpersError, match=re.escape(f"{path}:3: not UTF-8 text (invalid continuation byte at byte 18")
    ):
        load_corpus(path)


def test_shared_training_data_loads_when_present() -> None:
    path = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "news-headlines" / "train.jsonl"
    if not path.exists():
        pytest.skip("shared news-headlines data not present")
    corpus = load_corpus(path)
    assert len(corpus.users) == 55 and corpus.n_items == 3631


@pytest.mark.parametrize("read_size", [1, 2, 3, 1 << 20])
def test_the_corpus_is_read_in_pieces_with_text_modes_line_ends_and_hashed_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_size: int
) -> None:
    """Read whole, decoded and split, a corpus took ~5x its size in memory in every Ray worker (session review);
    read a piece at a time, a CR ending one piece and an LF starting the next are still one line end."""
    import hashlib

    from localpers.publish import corpus as corpus_module

    monkeypatch.setattr(corpus_module, "_READ_SIZE", read_size)
    good = json.dumps(GOOD_USER).encode()
    other = good.replace(b'"a"', b'"b"', 1)
    data = codecs.BOM_UTF8 + good + b"\r\n\r\n" + other + b"\r" + good.replace(b'"a"', b'"c"', 1) + b"\r"
    path = tmp_path / "pieces.jsonl"
    path.write_bytes(data)
    loaded = load_corpus(path)
    assert [user.line for user in loaded.users] == [1, 3, 4]
    assert loaded.sha256 == hashlib.sha256(data).hexdigest()
