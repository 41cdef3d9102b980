"""The CLI under the ninety-fourth session's audit.

`localpers.cli.app()` called from Python (as `scripts/` do) prints through Rich too: without the `localpers`
console script's set-up of the streams, a Rich table or line holding the user's text on an ASCII standard output
ended the command in a UnicodeEncodeError traceback half-way through its output. The app's root callback now
makes the output escape as the console script does, and only that: a process embedding the app keeps its own
descriptors (the review of d07b2f2 found the whole set-up there wrote the app's output into the caller's file).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import invoke

TEXT = "caf\u00e9 \u2014 na\u00efve"
ESCAPED = b"caf\\xe9 \\u2014 na\\xefve"  # as Python's backslashreplace writes it


def test_profile_printed_by_rich_from_the_app_called_from_python_escapes_on_an_ascii_stdout() -> None:
    invoke("user", "create", "ann")
    for number in range(3):  # three alike headlines: a series, whose latest `profile` prints through Rich
        added = invoke("history", "add", "-i", f"Council meeting number {number}", "-o", f"{TEXT} {number}")
        assert added.exit_code == 0, added.stderr
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.argv = ['localpers', 'profile']; from localpers.cli import app; app()",
        ],
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "ascii"},
        check=False,
        timeout=300,
    )
    assert shown.returncode == 0 and b"Traceback" not in shown.stderr, shown.stderr
    assert b"the latest: " + ESCAPED + b" 2" in shown.stdout, shown.stdout


def test_the_app_called_from_python_leaves_a_file_on_a_closed_stdouts_number_to_its_caller(
    tmp_path: Path,
) -> None:
    """A process started with standard output closed may open a file of its own on descriptor 1; calling the app
    must not take that file for standard output (the console script's own set-up does so at its start, before
    anything else is opened)."""
    log = tmp_path / "log.txt"
    code = (
        "import sys\n"
        "log = open(sys.argv[1], 'w')\n"
        "assert log.fileno() == 1 and sys.stdout is None, log.fileno()\n"
        "log.write('caller data\\n'); log.flush()\n"
        "from localpers.cli import app\n"
        "try:\n"
        "    app(['history', 'list', '--help'], standalone_mode=False)\n"
        "except SystemExit:\n"
        "    pass\n"
        "sys.stderr.write('stdout is None: %s' % (sys.stdout is None))\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code, str(log)],
        stderr=subprocess.PIPE,
        preexec_fn=lambda: os.close(1),  # noqa: PLW1509 - the child starts with standard output closed
        check=False,
        timeout=300,
    )
    assert ran.returncode == 0 and ran.stderr.endswith(b"stdout is None: True"), ran.stderr
    assert log.read_text() == "caller data\n"


def test_echo_escapes_on_an_ascii_stream_nothing_has_set_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """`common.echo` escapes itself where the stream still raises (`--version`, printed while the command line
    is parsed, before the root callback)."""
    from localpers.cli.common import echo

    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="ascii", write_through=True))
    echo(TEXT)
    assert raw.getvalue() == ESCAPED + b"\n"
