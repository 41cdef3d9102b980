"""Ctrl-C and stop signals: end a command the same clean way, and keep one that C code swallowed.

Python runs a signal's handler between bytecodes; when those are a ctypes callback's (llama.cpp's log, which
llama-cpp-python routes to Python from its import on), the KeyboardInterrupt raised there ends in ctypes'
"Exception ignored on calling ctypes callback" and the command carries on, and may save what the user asked
to stop. `install` sets a SIGINT handler that notes the Ctrl-C before raising it; code that has just returned
from llama.cpp calls `raise_pending`, which raises a noted Ctrl-C again. A Ctrl-C that was not swallowed ends
the command anyway (the command line exits on KeyboardInterrupt), so raising it twice never happens there.

SIGTERM (`kill`, a service manager, a container stopping) and SIGHUP (the terminal closed) would otherwise end
the process where it stands, with no word and a `.partial` file left behind; `install` routes them the same
way, as `Terminated`, a KeyboardInterrupt, so every clean-up and report that a Ctrl-C gets runs for them too,
and the command exits 128 + the signal's number (143 for SIGTERM), as a shell reports a process so stopped.
Work that saves as it goes (a fit's caches) marks a stop that came after a save failed (`mark_unsaved`), so the
command does not say its work was kept (`was_unsaved`). Once a command's work is done (`command_done`), the
console script ignores the stops, which would otherwise turn a finished command into exit 130 as the process
exits. This module does nothing else; it imports nothing of localpers.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT


class Terminated(KeyboardInterrupt):
    """A stop asked by a signal other than Ctrl-C's (SIGTERM, SIGHUP): handled as a Ctrl-C, reported as it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_pending: KeyboardInterrupt | None = None
_settle_when_done = False  # `command_done` ignores stop signals (`settle_when_done`)


def note(stop: KeyboardInterrupt | None = None) -> None:
    """Remember a stop (the handler, or a callback that caught it, calls this); a plain note keeps the kind
    already noted (a SIGTERM caught again inside a callback stays a SIGTERM)."""
    global _pending
    first_signal = isinstance(stop, Terminated) and not isinstance(_pending, Terminated)
    if stop is not None and (_pending is None or first_signal):
        _pending = stop
    elif _pending is None:
        _pending = KeyboardInterrupt()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    note()
    raise KeyboardInterrupt


def _on_stop_signal(signum: int, frame: FrameType | None) -> None:
    stop = Terminated(signum)
    note(stop)
    raise stop


def stop_signals() -> list[signal.Signals]:
    """The signals handled as a stop besides SIGINT, where the platform has them (Windows has no SIGHUP)."""
    return [getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]


def install() -> None:
    """Route SIGINT through the noting handler and SIGTERM/SIGHUP through the stopping one (main thread only,
    where Python lets handlers be set; a signal someone set to be ignored, as `nohup` does, stays ignored), and
    keep ctypes' "Exception ignored" report of a swallowed stop off the terminal: it is raised later."""
    if threading.current_thread() is not threading.main_thread():
        return
    install_stop_handlers()
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)
        previous_hook = sys.unraisablehook

        def quiet_about_ctrl_c(report: Any) -> None:
            if report.exc_type is not None and issubclass(report.exc_type, KeyboardInterrupt):
                return
            previous_hook(report)

        sys.unraisablehook = quiet_about_ctrl_c


def install_stop_handlers() -> None:
    """Route SIGTERM and SIGHUP through the stopping handler where they have the default action (main thread
    only); one set to be ignored stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in stop_signals():
        if signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, _on_stop_signal)


def settle_when_done() -> None:
    """Let `command_done` ignore stop signals (the console script asks it; an in-process caller such as a test
    keeps its handlers)."""
    global _settle_when_done
    _settle_when_done = True


def command_done() -> None:
    """A command finished its work (its output written, its state saved): a stop landing now, while the
    process exits, ended it 130 with no word, and a script read a success as a failure. From here on SIGINT,
    SIGTERM and SIGHUP are ignored where `settle_when_done` was called and they are routed here (main thread
    only): a test that runs the console script in-process keeps its own handlers. Not while another thread
    that exit waits for still runs (a TUI worker inside llama.cpp): a stop is what ends that wait."""
    if not _settle_when_done or threading.current_thread() is not threading.main_thread():
        return
    if any(
        thread.is_alive() and not thread.daemon
        for thread in threading.enumerate()
        if thread is not threading.current_thread()
    ):
        return
    for signum in (signal.SIGINT, *stop_signals()):
        if signal.getsignal(signum) in (_on_sigint, _on_stop_signal):
            signal.signal(signum, signal.SIG_IGN)


def raise_pending() -> None:
    """Raise the stop noted since the last call, if one was (once)."""
    global _pending
    stop, _pending = _pending, None
    if stop is not None:
        raise stop


def take_pending() -> KeyboardInterrupt | None:
    """The stop noted since the last call (and forget it), for code whose library swallowed it (uvicorn)."""
    global _pending
    stop, _pending = _pending, None
    return stop


@contextlib.contextmanager
def hangup_as_terminate() -> Iterator[None]:
    """Inside, SIGHUP asks for the same stop as SIGTERM (noted as a SIGHUP): for a server that handles SIGTERM
    itself and would otherwise meet our stop raised inside its event loop (uvicorn logs that as a crash)."""
    hangup = getattr(signal, "SIGHUP", None)
    if hangup is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(hangup)
    if previous is signal.SIG_IGN:  # nohup: stays ignored
        yield
        return

    def ask_to_terminate(signum: int, frame: FrameType | None) -> None:
        note(Terminated(signum))
        signal.raise_signal(signal.SIGTERM)

    signal.signal(hangup, ask_to_terminate)
    try:
        yield
    finally:
        signal.signal(hangup, previous)


def exit_code(stop: BaseException) -> int:
    """The exit code a command stopped by `stop` ends with: 143 for SIGTERM, 129 for SIGHUP, 130 for Ctrl-C."""
    return 128 + stop.signum if isinstance(stop, Terminated) else INTERRUPTED_EXIT_CODE


def stopped_word(stop: BaseException) -> str:
    """How the command's last line names the stop: "terminated" for a signal, "interrupted" for Ctrl-C."""
    return "terminated" if isinstance(stop, Terminated) else "interrupted"


_UNSAVED_NOTE = "localpers: what this work had done so far could not be saved"


def mark_unsaved(stop: BaseException) -> None:
    """Note on a stop in flight that the work it stopped could not save what it had done (PEP 678's notes)."""
    if not was_unsaved(stop):
        stop.add_note(_UNSAVED_NOTE)


def was_unsaved(stop: BaseException) -> bool:
    """Whether `mark_unsaved` was called on this stop."""
    return _UNSAVED_NOTE in getattr(stop, "__notes__", ())


@contextlib.contextmanager
def marking_unsaved(failed: Callable[[], bool]) -> Iterator[None]:
    """Mark a stop that passes through (`mark_unsaved`) when `failed()` then says a save of the work failed."""
    try:
        yield
    except KeyboardInterrupt as stop:
        if failed():
            mark_unsaved(stop)
        raise
