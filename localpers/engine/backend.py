"""llama.cpp's process-wide setup: the backend is initialised once, and its log goes through one sink.

The sink is silent unless LOCALPERS_LLAMA_LOG is set, and records text while asked to: recording is how the
engine learns which buffer types the weights got (llama.cpp reports them only in its load log,
`CPU_REPACK model buffer size = ... MiB`) and why a grammar was refused. Its grammar parser alone writes to the
process's stderr directly, with the grammar's text; `captured_c_stderr` takes that in instead (a server must not
log request text). A Ctrl-C that lands while llama.cpp is
inside the callback would be swallowed by ctypes ("Exception ignored on calling ctypes callback") and the
command would carry on; it is noted instead (`localpers.interrupts`), and `raise_pending_interrupt` raises it
once llama.cpp has returned. Nothing else lives here.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile
import threading
from collections.abc import Iterator

from localpers import interrupts
from localpers.engine.llama import llama_cpp


class _LogRecorder:
    """llama.cpp's log callback: writes to stderr only when asked, records pieces while recording."""

    def __init__(self) -> None:
        self.recording: list[str] | None = None

    def __call__(self, level: int, text: bytes | None, user_data: ctypes.c_void_p) -> None:
        try:
            piece = (text or b"").decode("utf-8", errors="replace")
            if self.recording is not None:
                self.recording.append(piece)
            if llama_log_wanted():
                sys.stderr.write(piece)
        except KeyboardInterrupt as stop:
            interrupts.note(stop)  # ctypes would drop it: raised by raise_pending_interrupt instead


def llama_log_wanted() -> bool:
    """Whether LOCALPERS_LLAMA_LOG asks for llama.cpp's log on stderr: set, and not 0, false, no or off."""
    return os.environ.get("LOCALPERS_LLAMA_LOG", "").strip().lower() not in ("", "0", "false", "no", "off")


_log_recorder = _LogRecorder()
_log_callback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(_log_recorder)

_backend_ready = False


def init_backend() -> None:
    """Route llama.cpp's log through the sink and initialise its backend (once per process)."""
    global _backend_ready
    if not _backend_ready:
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _backend_ready = True
    raise_pending_interrupt()


def raise_pending_interrupt() -> None:
    """Raise a Ctrl-C that C code swallowed (in llama.cpp's log callback, or llama-cpp-python's before it).

    Only in the main thread, where Python runs signal handlers, so where a callback can have swallowed one: a worker
    thread (the API's generations) took the server's stop for itself, and the server then exited as if none came."""
    if threading.current_thread() is threading.main_thread():
        interrupts.raise_pending()


@contextlib.contextmanager
def recorded_llama_log() -> Iterator[list[str]]:
    """Collect what llama.cpp logs inside the block (as it arrives: pieces, not necessarily lines).

    A Ctrl-C pressed inside the block is raised when it ends.
    """
    pieces: list[str] = []
    previous = _log_recorder.recording
    _log_recorder.recording = pieces
    try:
        yield pieces
    finally:
        _log_recorder.recording = previous
    raise_pending_interrupt()


@contextlib.contextmanager
def captured_c_stderr() -> Iterator[list[str]]:
    """What C code writes to file descriptor 2 inside the block, kept from the terminal and handed over as one
    string appended to the yielded list when the block ends. Anything another thread writes to stderr in that
    window is taken in too, so the block must stay short (one llama.cpp call)."""
    sys.stderr.flush()
    captured: list[str] = []
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured.append(sink.read().decode("utf-8", errors="replace"))
