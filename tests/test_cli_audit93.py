"""The CLI under the ninety-third session's audit.

Each test is a case that went wrong before: a `--json` success printed an object with no "ok" key, where a
refusal or a stop prints `{"ok": false, ...}`, so a script reading `out.get("ok")` took a success for a failure;
on an ASCII standard output (`PYTHONIOENCODING=ascii`) `history list` and every other line printed through
Click (an error naming the user's text) came out as raw UTF-8, where a streamed rewrite writes `\\u2014`.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import invoke, one_line_error

import localpers.cli


def answer(*args: str) -> dict:
    """The JSON object `localpers ARGS --json` printed, the command checked to have succeeded."""
    result = invoke(*args, "--json")
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def test_json_successes_say_ok_true_first() -> None:
    answers = [
        answer("user", "create", "ann"),
        answer("user", "list"),
        answer("history", "add", "-i", "An article about a café.", "-o", "Café — naïve"),
        answer("history", "add", "-i", "Another article.", "-o", "Second headline"),
        answer("history", "list"),
        answer("user", "show"),
        answer("history", "remove", "--oldest", "1"),
    ]
    for shown in answers:
        assert shown["ok"] is True and next(iter(shown)) == "ok", shown
    assert answers[4]["items"][0]["output"] == "Café — naïve"  # the payload itself is as it was


def test_doctor_keeps_its_own_ok_which_says_whether_it_found_a_problem(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LOCALPERS_MODEL", str(tmp_path / "nothere.gguf"))  # a problem: no backbone
    result = invoke("doctor", "--json")
    report = json.loads(result.stdout)
    assert report["problems"] and report["ok"] is False and result.exit_code == 1, report


TEXT = "caf\u00e9 \u2014 na\u00efve \U0001f600"
ESCAPED = b"caf\\xe9 \\u2014 na\\xefve \\U0001f600"  # as Python's backslashreplace writes it


def _console(*args: str, code: str | None = None) -> subprocess.CompletedProcess[bytes]:
    """`localpers ARGS` (or the Python `code`) in a child process whose standard streams are ASCII."""
    command = ["-c", code] if code is not None else ["-m", "localpers.cli", *args]
    return subprocess.run(
        [sys.executable, *command],
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "ascii"},
        check=False,
        timeout=300,
    )


def test_history_list_on_an_ascii_stdout_escapes_as_a_streamed_rewrite_does() -> None:
    invoke("user", "create", "ann")
    assert invoke("history", "add", "-i", f"An article: {TEXT}", "-o", TEXT).exit_code == 0
    listed = _console("history", "list")
    assert listed.returncode == 0 and listed.stderr == b"", listed.stderr
    assert listed.stdout.splitlines()[0].endswith(b"  headline  " + ESCAPED), listed.stdout
    assert listed.stdout.splitlines()[1].endswith(b"<- An article: " + ESCAPED), listed.stdout
    streamed = _console(  # the rewrite's and generate's streamed text, which escaped already
        code="from localpers.cli.streams import usable_standard_streams as u; u();"
        f"from localpers.cli.common import stdout_stream as s; s(strip_leading=False)({TEXT!r})",
    )
    assert streamed.returncode == 0 and streamed.stdout == ESCAPED, streamed.stderr
    refused = _console("history", "remove", TEXT)  # an error line quoting the text: on stderr, escaped too
    assert refused.returncode == 1 and refused.stderr.startswith(b"error: no history item '" + ESCAPED + b"'")


def test_the_app_called_from_python_on_an_ascii_stdout_escapes_too() -> None:
    """`scripts/` call `localpers.cli.app()` without the `localpers` command's set-up of the streams: a line of
    the user's text on an ASCII stdout ended the command in a UnicodeEncodeError traceback (the review of
    91a5c5f), where Click's own writer had printed UTF-8 before. (Since the ninety-fourth session the app's root
    callback makes the stream escape; `echo`'s own escape is tested in test_cli_audit94.)"""
    invoke("user", "create", "ann")
    assert invoke("history", "add", "-i", f"An article: {TEXT}", "-o", TEXT).exit_code == 0
    listed = _console(
        code="import sys; sys.argv = ['localpers', 'history', 'list']; from localpers.cli import app; app()"
    )
    assert listed.returncode == 0 and b"Traceback" not in listed.stderr, listed.stderr
    assert listed.stdout.splitlines()[0].endswith(b"  headline  " + ESCAPED), listed.stdout


def test_the_command_line_prints_through_echo_not_clicks_own_stdout() -> None:
    """`typer.echo` without a file writes through a UTF-8 writer of Click's over an ASCII stdout: every line
    goes through `common.echo`, which writes onto the stream as it is."""
    folder = Path(localpers.cli.__file__).parent
    direct = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("echo", "secho")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in ("typer", "click", "rich")
                and not any(keyword.arg == "file" for keyword in node.keywords)
            ) or (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"):
                direct.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and node.module in ("typer", "click", "rich"):
                direct += [
                    f"{path.name}:{node.lineno}"
                    for alias in node.names
                    if alias.name in ("echo", "secho", "print")
                ]
    assert direct == [], direct


def test_bench_given_a_history_file_says_so_and_what_it_takes(tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    items = [{"input": "An article.", "output": "A Headline"}, {"input": "Another.", "output": "Another"}]
    history.write_text("\n" + "".join(json.dumps(item) + "\n" for item in items))  # a blank first line
    out = tmp_path / "out"
    refused = invoke("bench", "--data", str(history), "--out", str(out))
    line = one_line_error(
        refused, f"{history} line 2: this looks like a history file (items with input and output"
    )
    assert (
        "one line per user with user_id, history and queries, e.g. ../shared/data/news-headlines/test.jsonl"
        in line
    )
    assert not out.exists()
    split = invoke("bench", "--data", str(history), "--out", str(out), "--dev-split", "--json")
    line = one_line_error(split, "this looks like a history file")
    assert "with user_id and history, e.g. ../shared/data/news-headlines/train.jsonl" in line
    assert json.loads(split.stdout) == {"ok": False, "error": line.removeprefix("error: ")}
    nameless = tmp_path / "nameless.jsonl"  # a user's line missing its id is still told so
    nameless.write_text(json.dumps({"history": items, "queries": items}) + "\n")
    one_line_error(
        invoke("bench", "--data", str(nameless), "--out", str(out)),
        "line 1: field 'user_id' must be a non-empty string or an integer",
    )
