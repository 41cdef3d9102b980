"""Standard input, output and error made safe to use, however the process was started.

`usable_standard_streams` is for the `localpers` console script, once its Ctrl-C handling is in place: it opens a
closed standard stream on the null device and makes a non-UTF-8 output escape what it cannot encode. The app's
root callback calls `escaping_standard_output` only, so that the app called from Python (`localpers.cli.app()`,
as scripts/ do) prints Rich's tables and streamed text as the command does; a process that embeds the app keeps
its own descriptors (one that closed standard output may have a file of its own on that number). It imports
nothing of localpers; it does nothing else.
"""

from __future__ import annotations

import os
import sys


def usable_standard_streams() -> None:
    """Make standard input, output and error safe to use whatever the process was started with.

    A closed one (`>&-`) is opened on the null device: Python would leave `sys.stdout` None (a streamed
    rewrite failed on it) and the next file opened, a user's history say, would take its number, so anything
    written to standard output would land in that file. On an output whose encoding is not UTF-8 (a Latin-1
    locale, `PYTHONIOENCODING=ascii`), a character it cannot encode is written as an escape (`\\u2019`)
    instead of ending the command with a traceback half-way through its output.
    """
    for descriptor in (0, 1, 2):
        try:
            os.fstat(descriptor)
        except OSError:
            opened = os.open(
                os.devnull, os.O_RDWR
            )  # the lowest free number: this one, if lower ones are open
            if opened != descriptor:
                os.dup2(opened, descriptor)
                os.close(opened)
    if sys.stdin is None:
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - the process's own, never closed
    for name, descriptor in (("stdout", 1), ("stderr", 2)):
        if getattr(sys, name) is None:
            setattr(sys, name, open(descriptor, "w", encoding="utf-8", closefd=False))  # noqa: SIM115
    escaping_standard_output()


def escaping_standard_output() -> None:
    """Make standard output and error, where their encoding is not UTF-8, write a character they cannot encode
    as an escape (`\\u2019`) instead of raising; a stream that is None, or UTF-8, is left as it is."""
    for stream in (sys.stdout, sys.stderr):
        if (
            stream is not None
            and not is_utf8(getattr(stream, "encoding", None))
            and hasattr(stream, "reconfigure")
        ):
            stream.reconfigure(errors="backslashreplace")


def is_utf8(encoding: str | None) -> bool:
    """Whether a stream's `encoding` names UTF-8 (in any of Python's spellings); None does not."""
    return (encoding or "").lower().replace("-", "").replace("_", "") in ("utf8", "utf8sig")
