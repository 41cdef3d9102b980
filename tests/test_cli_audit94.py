"""The CLI under the ninety-fourth session's audit.

`localpers.cli.app()` called from Python (as `scripts/` do) prints through Rich too: without the `localpers`
console script's set-up of the streams, a Rich table or line holding the user's text on an ASCII standard output
ended the command in a UnicodeEncodeError traceback half-way through its output. The app's root callback now
sets the streams up as the console script does.
"""

from __future__ import annotations

import os
import subprocess
import sys

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
