"""A FIFO for tests of readers that must refuse one: what a reader that opens it anyway would get.

`fed_fifo(path, data)` makes `path` a FIFO and, for the block, feeds `data` to the first reader that opens it
(code that reads a FIFO blocks until a writer comes: without one, a test of the old code would hang forever
instead of failing). The writer gives up after `seconds` when no reader comes, as a refusing reader never does.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def fed_fifo(path: Path, data: bytes = b"", seconds: float = 2.0) -> Iterator[None]:
    os.mkfifo(path)

    def write_once_a_reader_opens() -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                descriptor = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # fails until a reader has it open
            except OSError:
                time.sleep(0.02)
                continue
            os.write(descriptor, data)
            os.close(descriptor)
            return

    writer = threading.Thread(target=write_once_a_reader_opens, daemon=True)
    writer.start()
    try:
        yield
    finally:
        writer.join()
