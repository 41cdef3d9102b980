"""llama.cpp's process-wide setup: the backend is initialised once, and its log goes through one sink.

The sink is silent unless LOCALPERS_LLAMA_LOG is set, and records text while asked to: recording is how the
engine learns which buffer types the weights got (llama.cpp reports them only in its load log,
`CPU_REPACK model buffer size = ... MiB`) and why a grammar was refused. Nothing else lives here.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator

import llama_cpp


class _LogRecorder:
    """llama.cpp's log callback: writes to stderr only when asked, records pieces while recording."""

    def __init__(self) -> None:
        self.recording: list[str] | None = None

    def __call__(self, level: int, text: bytes | None, user_data: ctypes.c_void_p) -> None:
        piece = (text or b"").decode("utf-8", errors="replace")
        if self.recording is not None:
            self.recording.append(piece)
        if os.environ.get("LOCALPERS_LLAMA_LOG"):
            sys.stderr.write(piece)


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


@contextlib.contextmanager
def recorded_llama_log() -> Iterator[list[str]]:
    """Collect what llama.cpp logs inside the block (as it arrives: pieces, not necessarily lines)."""
    pieces: list[str] = []
    previous = _log_recorder.recording
    _log_recorder.recording = pieces
    try:
        yield pieces
    finally:
        _log_recorder.recording = previous
