"""`localpers bench` refuses malformed input files and arguments with one line and exit code 2, before any
model is loaded; the data file is read as a history import reads its file (lines end at "\\n" only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from localpers.bench.data import read_bench_file
from localpers.cli import app
from localpers.errors import InputError

PROMPT = "Generate a headline for the following article: "


def _user(user_id: str = "a", history_input: str = "x", query_input: str = "z") -> dict:
    return {
        "user_id": user_id,
        "history": [{"input": PROMPT + history_input, "output": "y"}],
        "queries": [{"id": "q1", "input": PROMPT + query_input, "output": "w"}],
    }


def _bench(data: Path, out: Path, *extra: str) -> object:
    return CliRunner().invoke(app, ["bench", "--data", str(data), "--out", str(out), *extra])


@pytest.mark.parametrize(
    ("record", "where"),
    [
        (_user(history_input="x\ud800"), " (user a) history item 1: field 'input'"),
        (_user(query_input="z\udfff"), " (user a) query 1: field 'input'"),
        (
            {**_user(), "history": [{"input": PROMPT + "x", "output": "y\ud800"}]},
            " (user a) history item 1: field 'output'",
        ),
        (
            {**_user(), "queries": [{"id": "q\ud800", "input": PROMPT + "z", "output": "w"}]},
            " (user a) query 1: field 'id'",
        ),
        (_user("a\ud800"), ": field 'user_id'"),
    ],
)
def test_a_lone_surrogate_is_one_line_naming_file_line_user_item_and_field(
    tmp_path: Path, record: dict, where: str
) -> None:
    path = tmp_path / "surrogate.jsonl"
    path.write_text(
        json.dumps(_user("first")) + "\n" + json.dumps(record) + "\n"
    )  # json escapes it as \ud800
    result = _bench(path, tmp_path / "out", "-m", "global")
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert f"error: {path} line 2{where} is not Unicode text (a lone surrogate" in result.output


def test_a_line_separator_inside_a_json_string_is_text_not_a_line_end(tmp_path: Path) -> None:
    path = tmp_path / "u2028.jsonl"
    users = [_user("a", history_input="x\u2028Second paragraph."), _user("b", history_input="x\x85NEL here.")]
    path.write_text("".join(json.dumps(u, ensure_ascii=False) + "\n" for u in users), encoding="utf-8")
    read = read_bench_file(path)
    assert [(user.user_id, user.line) for user in read.users] == [("a", 1), ("b", 2)]


def test_numbered_authors_are_read_as_publish_reads_them(tmp_path: Path) -> None:
    """A corpus `localpers publish` trains on (integer user ids) could not be benchmarked: the bench refused it."""
    path = tmp_path / "numbered.jsonl"
    path.write_text(
        json.dumps({**_user(), "user_id": 7}) + "\n" + json.dumps({**_user(), "user_id": "7"}) + "\n"
    )
    with pytest.raises(InputError, match="line 2: user_id '7' collides with line 1"):
        read_bench_file(path)
    path.write_text(
        json.dumps({**_user(), "user_id": 7}) + "\n" + json.dumps({**_user(), "user_id": True}) + "\n"
    )
    with pytest.raises(InputError, match="line 2: field 'user_id' must be"):
        read_bench_file(path)
    path.write_text(json.dumps({**_user(), "user_id": 7}) + "\n")
    assert [user.user_id for user in read_bench_file(path).users] == ["7"]


def test_a_record_naming_a_key_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "twice.jsonl"
    path.write_text(json.dumps(_user("a"))[:-1] + ', "user_id": "b"}\n')
    result = _bench(path, tmp_path / "out", "-m", "global")
    assert result.exit_code == 2, result.output
    assert f"error: {path} line 1: not valid JSON (duplicate key 'user_id')" in result.output


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{bad json\n", "line 1: not valid JSON"),
        (b"[1, 2]\n", "line 1: expected a JSON object"),
        (b"\xff\xfe not utf-8\n", "cannot read"),
        (
            json.dumps({**_user(), "user_id": 3.5}).encode() + b"\n",
            "field 'user_id' must be a non-empty string or an integer",
        ),
        (json.dumps({**_user(), "history": {}}).encode() + b"\n", "field 'history' must be a list"),
        ((json.dumps(_user()) + "\n" + json.dumps(_user())).encode() + b"\n", "collides with line 1"),
        (
            json.dumps({**_user(), "queries": [{"id": ["q"], "input": PROMPT + "z", "output": "w"}]}).encode()
            + b"\n",
            "field 'id' must be a string",
        ),
        (json.dumps({**_user(), "queries": []}).encode() + b"\n", "add --dev-split"),
        (b"\n", "holds no users"),
    ],
)
def test_a_malformed_data_file_exits_2(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    result = _bench(path, tmp_path / "out", "-m", "global")
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_a_data_path_that_is_no_file_exits_2(tmp_path: Path) -> None:
    for path, message in ((tmp_path / "nope.jsonl", "no such file"), (tmp_path, "is a directory")):
        result = _bench(path, tmp_path / "out")
        assert result.exit_code == 2 and message in result.output, result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-m", "bogus"], "unknown method 'bogus'"),
        (["-m", "card@stength=1"], "has no parameter 'stength'"),
        (["-m", "card@strength=inf"], "strength=inf is not a finite number"),
        (["-m", "card@strength=1e400"], "strength=1e400 is not a finite number"),
        (["-m", "card@strength=1,strength=2"], "strength is given twice"),
        (["-m", "rag@history=all,k=2,history=3"], "history is given twice"),
        (["-m", "card@"], "nothing follows '@'"),  # ran plain card without a word
        (["-m", ""], "--methods names no method"),  # ran the baseline alone without a word
        (["--probes", "-m", ","], "--methods names no method"),
        (["--probes", "--probe-history", "0"], "--probe-history: '0' is not a positive count"),
        (["--probes", "--styles", "bogus"], "unknown style 'bogus'"),
        (["--probes", "--styles", ","], "--styles: name at least one style"),
        (["--probes", "--styles", ""], "--styles: name at least one style"),  # ran the default styles
        (["--probes", "--probe-history", ""], "--probe-history: '' is not a positive count"),  # and sizes
        (["--probes", "-m", "card@strength=inf"], "not a finite number"),
        (["--probes", "--history-limit", "1"], "--history-limit does not apply with --probes"),
        (["--styles", "kicker"], "--styles applies only with --probes"),
        (["--probe-history", "5"], "--probe-history applies only with --probes"),
        (["--seed", "-1"], "--seed"),
        (["--seed", str(2**32)], "--seed"),
        (["--bootstrap", "100001"], "--bootstrap"),
    ],
)
def test_a_bad_argument_exits_2_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    from localpers.methods.card.personalizer import Personalizer

    def no_model(**_: object) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(Personalizer, "open", staticmethod(no_model))
    path = tmp_path / "users.jsonl"
    path.write_text(json.dumps(_user()) + "\n")
    result = _bench(path, tmp_path / "out", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_the_seed_and_bootstrap_ranges_are_in_the_help() -> None:
    result = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "200"})
    assert "0 to 2**32-1" in result.output and "100 to 100,000" in result.output


def test_an_out_that_cannot_be_made_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    """It was refused after the model loaded, in a message naming neither the option nor what to do."""
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(_user()) + "\n")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("a file\n")
    result = _bench(path, a_file / "run", "-m", "global", "--model", str(tmp_path / "absent.gguf"))
    assert result.exit_code == 1, result.output
    assert (
        f"error: --out {a_file / 'run'} cannot be made: {a_file} is a file, not a directory" in result.output
    )


def test_an_out_in_a_folder_that_cannot_be_written_is_refused_at_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only folder (or file system) as --out, or as the folder a new --out goes in, failed only when the
    results were written. This machine's tests run as root, which may write anywhere: the permission is faked."""
    import os

    from localpers import paths

    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(_user()) + "\n")
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access

    def access(
        path: object, mode: int, **options: object
    ) -> bool:  # write refused in `locked`, as root never is
        return not (Path(str(path)) == locked and mode & os.W_OK) and real_access(path, mode, **options)

    monkeypatch.setattr(paths.os, "access", access)
    absent_model = str(tmp_path / "absent.gguf")
    result = _bench(path, locked, "-m", "global", "--model", absent_model)
    assert result.exit_code == 1, result.output
    assert (
        f"error: --out {locked} cannot be written (its permissions, or a read-only file system)"
        in result.output
    )
    result = _bench(path, locked / "run", "-m", "global", "--model", absent_model)
    assert result.exit_code == 1, result.output
    assert f"error: --out {locked / 'run'} cannot be made: {locked} cannot be written" in result.output


def test_a_second_run_into_a_busy_out_is_refused_and_leaves_the_first_ones_files(tmp_path: Path) -> None:
    """Two runs into one --out deleted each other's staging folder and blamed disk space (audit85)."""
    fcntl = pytest.importorskip("fcntl")  # POSIX: elsewhere nothing is locked
    import os

    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(_user()) + "\n")
    out = tmp_path / "out"
    (out / "cache").mkdir(parents=True)  # the running one's
    holder = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        result = _bench(path, out, "-m", "global")
    finally:
        os.close(holder)
    assert result.exit_code == 1 and f"another localpers bench is running into --out {out}" in result.output
    assert sorted(p.name for p in out.iterdir()) == ["cache"]


def test_the_dev_split_leaves_out_an_item_listed_twice_and_names_authors_too_short(tmp_path: Path) -> None:
    # an item listed twice and moved into the queries stopped the whole run ("duplicate id"); a file whose
    # authors were all too short was "holds no users" (eighty-seventh session's bench audit)
    prefix = "Generate a headline for the following article: "

    def item(number: int) -> dict[str, str]:
        return {
            "id": f"n{number}",
            "date": f"2018-01-{number:02d}",
            "input": f"{prefix}Article number {number} about things.",
            "output": f"Headline {number} Here",
        }

    repeated = tmp_path / "repeated.jsonl"
    history = [item(number) for number in range(1, 20)] + [item(19)]
    repeated.write_text(json.dumps({"user_id": "a", "history": history}) + "\n", encoding="utf-8")
    read = read_bench_file(repeated, dev_split=True)
    (user,) = read.users
    ids = [query.id for query in user.queries] + [entry.source for entry in user.history]
    assert len(ids) == len(set(ids)) == 19
    assert any("duplicate" in note for note in read.notes)

    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps({"user_id": "b", "history": [item(1), item(2)]}) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"every author is too short for the dev split .*\bb\b"):
        read_bench_file(short, dev_split=True)
