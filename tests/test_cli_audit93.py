"""The CLI under the ninety-third session's audit.

Each test is a case that went wrong before: a `--json` success printed an object with no "ok" key, where a
refusal or a stop prints `{"ok": false, ...}`, so a script reading `out.get("ok")` took a success for a failure.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import invoke


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
