"""Odd locales, encodings and standard streams (the seventy-third session's locale audit).

Before: UTF-8 piped in under a Latin-1 locale was stored as mojibake with exit 0; a streamed rewrite, `history
list`, `user show` or `--json` ended in UnicodeEncodeError on a stdout that could not encode a character (the
JSON printed nothing); UTF-8 arguments under `LC_ALL=C` without UTF-8 mode were refused with advice that would
have stored mojibake; a closed stdout broke streamed output; `--help` into a full disk gave a traceback; the
user's own text was taken as rich markup by `profile`; Windows device names were taken as user names.
Each case runs the console script in a child process, with the environment that shows it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from localpers import atomic
from localpers.errors import InputError
from localpers.users.store import UserStore

TEXT = "Café crème 東京 😀"


def _run(
    home: Path, *args: str, stdin: bytes | None = None, **env: str
) -> subprocess.CompletedProcess[bytes]:
    environment = {**os.environ, "LOCALPERS_HOME": str(home), **env}
    return subprocess.run(
        [sys.executable, "-m", "localpers.cli", *args],
        input=stdin,
        capture_output=True,
        env=environment,
        check=False,
        timeout=300,
    )


def _add(home: Path, input: str, output: str, stdin: bytes | None = None, **env: str):
    """`localpers history add` for user lat (`-` reads `stdin`)."""
    return _run(home, "history", "add", "-u", "lat", "-i", input, "-o", output, stdin=stdin, **env)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    assert _run(home, "user", "create", "lat").returncode == 0
    return home


def test_text_piped_in_is_read_as_utf8_whatever_the_locale(home: Path) -> None:
    added = _add(home, "x", "-", stdin=TEXT.encode(), PYTHONIOENCODING="latin-1")
    assert added.returncode == 0, added.stderr
    listed = _run(home, "history", "list", "-u", "lat", "--json")
    assert json.loads(listed.stdout)["items"][0]["output"] == TEXT
    refused = _add(home, "x", "-", stdin="Café".encode("latin-1"))
    assert refused.returncode == 2 and refused.stderr.decode().startswith(
        "error: standard input is not UTF-8"
    )


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_output_that_stdout_cannot_encode_is_escaped_and_json_stays_valid(home: Path, encoding: str) -> None:
    assert _add(home, "x", TEXT).returncode == 0
    as_json = _run(home, "history", "list", "-u", "lat", "--json", PYTHONIOENCODING=encoding)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["items"][0]["output"] == TEXT
    shown = _run(home, "user", "show", "lat", "--json", PYTHONIOENCODING=encoding)
    assert shown.returncode == 0 and json.loads(shown.stdout)["name"] == "lat"
    streamed = subprocess.run(
        [
            sys.executable,
            "-c",
            "from localpers.cli.streams import usable_standard_streams as u; u();"
            "from localpers.cli.common import stdout_stream as s; s(strip_leading=False)('it\u2019s \U0001f600')",
        ],
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": encoding},
        check=False,
    )
    assert streamed.returncode == 0, streamed.stderr
    assert streamed.stdout == b"it\\u2019s \\U0001f600"


def test_utf8_arguments_under_a_locale_python_cannot_decode_are_recovered(home: Path) -> None:
    added = _add(
        home,
        "Café",
        TEXT,
        PYTHONUTF8="0",
        PYTHONCOERCECLOCALE="0",
        LC_ALL="C",
        LANG="C",
    )
    assert added.returncode == 0, added.stderr
    listed = _run(home, "history", "list", "-u", "lat", "--json")
    item = json.loads(listed.stdout)["items"][0]
    assert item["output"] == TEXT and item["input"].endswith("Café")


def test_a_closed_stdout_and_a_full_disk_are_not_tracebacks(home: Path) -> None:
    code = (
        "import os; os.close(1)\n"
        "from localpers.cli.streams import usable_standard_streams; usable_standard_streams()\n"
        "handle = open(os.devnull)\n"  # would have taken number 1, and anything printed would land in it
        "assert handle.fileno() != 1\n"
        "from localpers.cli.common import stdout_stream; stdout_stream(strip_leading=False)('a headline')\n"
    )
    closed = subprocess.run([sys.executable, "-c", code], capture_output=True, check=False)
    assert closed.returncode == 0, closed.stderr
    with open("/dev/full", "wb") as full:
        helped = subprocess.run(
            [sys.executable, "-m", "localpers.cli", "--help"],
            stdout=full,
            stderr=subprocess.PIPE,
            check=False,
            # buffered, as a plain shell runs it: what could not be written was tried again at exit
            env={name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"},
        )
    assert helped.returncode == 1 and helped.stderr == b"error: No space left on device\n"
    with open(
        "/dev/full", "wb"
    ) as full:  # with --json the verdict's own write failed and the error came twice
        shown = subprocess.run(
            [sys.executable, "-m", "localpers.cli", "user", "list", "--json"],
            stdout=full,
            stderr=subprocess.PIPE,
            check=False,
            env={name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"},
        )
    assert shown.returncode == 1 and shown.stderr == b"error: No space left on device\n"


def test_windows_device_names_are_refused_for_new_users_only() -> None:
    with pytest.raises(InputError, match="device name on Windows"):
        UserStore().create("con")
    for reserved in ("com1", "com9", "lpt1", "lpt9", "nul"):  # every numbered port, the ninth too
        with pytest.raises(InputError, match="device name on Windows"):
            UserStore().create(reserved)
    assert UserStore().create("con1").name == "con1"
    assert UserStore().create("com10").name == "com10"


def test_temp_files_are_never_swept_by_a_kill_on_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    def kill(*args: object) -> None:
        raise AssertionError("os.kill(pid, 0) sends a Ctrl-C event on Windows")

    monkeypatch.setattr(atomic, "ON_WINDOWS", True)
    monkeypatch.setattr(atomic.os, "kill", kill)
    assert atomic.process_is_running(4242)


def test_a_writer_that_cannot_be_checked_is_taken_as_running_and_no_pid_as_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mutation round (ninety-first session): a temp file whose writer is another account's process, or whose pid
    os.kill cannot take, must be left (taken as running); pid 0, which os.kill reads as this process group, is no
    writer's."""
    assert not atomic.process_is_running(0) and not atomic.process_is_running(-1)
    assert atomic.process_is_running(2**70)  # OverflowError in os.kill: a number it cannot check
    assert atomic.process_is_running(os.getpid())

    def another_accounts(pid: int, signal: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(atomic.os, "kill", another_accounts)
    assert atomic.process_is_running(4242)


def test_profile_shows_the_users_own_text_literally_never_as_markup(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from localpers.cli.profile import _print_profile

    profile = {
        "user": "mk",
        "card": None,
        "series": [],
        "exact": {
            "indexed_inputs": 3,
            "k": 2,
            "frequencies": [{"attribute": "[red]tone[/]", "count": 2, "share": 0.66}],
            "retrieved": {
                "attributes": ["[b]brief"],
                "similarity": 0.9,
                "matched_input": "Council [/b] vote",
            },
        },
    }
    _print_profile(profile, asked_for_text=True)
    out = capsys.readouterr().out
    assert "Council [/b] vote" in out and "[red]tone[/]" in out and "[b]brief" in out
