"""A Ctrl-C that C code swallowed, kept until Python can raise it.

Python runs a signal's handler between bytecodes; when those are a ctypes callback's (llama.cpp's log, which
llama-cpp-python routes to Python from its import on), the KeyboardInterrupt raised there ends in ctypes'
"Exception ignored on calling ctypes callback" and the command carries on, and may save what the user asked
to stop. `install` sets a SIGINT handler that notes the Ctrl-C before raising it; code that has just returned
from llama.cpp calls `raise_pending`, which raises a noted Ctrl-C again. A Ctrl-C that was not swallowed ends
the command anyway (the command line exits on KeyboardInterrupt), so raising it twice never happens there.
This module does nothing else; it imports nothing of localpers.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import Any

_pending = False


def note() -> None:
    """Remember a Ctrl-C (the handler, or a callback that caught it, calls this)."""
    global _pending
    _pending = True


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    note()
    raise KeyboardInterrupt


def install() -> None:
    """Route SIGINT through the noting handler (main thread only, where Python lets handlers be set), and
    keep ctypes' "Exception ignored" report of a swallowed Ctrl-C off the terminal: it is raised later."""
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ):
        signal.signal(signal.SIGINT, _on_sigint)
        previous_hook = sys.unraisablehook

        def quiet_about_ctrl_c(report: Any) -> None:
            if report.exc_type is not None and issubclass(report.exc_type, KeyboardInterrupt):
                return
            previous_hook(report)

        sys.unraisablehook = quiet_about_ctrl_c


def raise_pending() -> None:
    """Raise the Ctrl-C noted since the last call, if one was (once)."""
    global _pending
    if _pending:
        _pending = False
        raise KeyboardInterrupt
