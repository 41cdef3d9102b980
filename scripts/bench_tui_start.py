"""Time `localpers tui` from start to its first frame: until a text of its first screen is on the terminal.

The TUI runs in a pseudo-terminal (80x24, TERM=xterm-256color) and is killed once `--marker` has arrived; the time
of its first output bytes is reported beside it. With several `--tree` checkouts, each is put first on PYTHONPATH
(so it wins over the installed one) and the rounds alternate between them. Uses the LOCALPERS_HOME of the caller:
with no users the first screen is the welcome screen, whose "Demo user" is the default marker. POSIX only; it does
not check what the screen shows beyond the marker.

    python scripts/bench_tui_start.py --tree ../old --tree . --rounds 7
"""

from __future__ import annotations

import argparse
import os
import pty
import select
import signal
import statistics
import struct
import sys
import time


def first_frame(tree: str | None, marker: bytes, timeout: float) -> tuple[float, float]:
    """(seconds to the first output bytes, seconds to `marker`) of one start of the TUI."""
    started = time.perf_counter()
    pid, terminal = pty.fork()
    if pid == 0:  # the child: the TUI on the pseudo-terminal
        environment = {**os.environ, "TERM": "xterm-256color"}
        if tree is not None:
            environment["PYTHONPATH"] = os.path.abspath(tree)
        os.execvpe(sys.executable, [sys.executable, "-m", "localpers.cli", "tui"], environment)
    import fcntl
    import termios

    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    seen = b""
    first_bytes = None
    try:
        while marker not in seen:
            left = timeout - (time.perf_counter() - started)
            ready, _, _ = select.select([terminal], [], [], max(left, 0))
            if not ready:
                raise SystemExit(f"no {marker.decode()!r} on the screen within {timeout:.0f} s")
            try:
                chunk = os.read(terminal, 65536)
            except OSError:
                raise SystemExit(f"the TUI ended before {marker.decode()!r}: {seen[-300:]!r}") from None
            if first_bytes is None:
                first_bytes = time.perf_counter() - started
            seen += chunk
        return first_bytes or 0.0, time.perf_counter() - started
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(terminal)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", action="append", help="a checkout to time (repeatable); default: installed")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--marker", default="Demo user", help="a text of the first screen")
    parser.add_argument("--timeout", type=float, default=60.0)
    arguments = parser.parse_args()
    trees: list[str | None] = list(arguments.tree or [None])
    times: dict[str | None, list[tuple[float, float]]] = {tree: [] for tree in trees}
    for _ in range(arguments.rounds):
        for tree in trees:
            times[tree].append(first_frame(tree, arguments.marker.encode(), arguments.timeout))
    for tree, runs in times.items():
        print(
            f"{tree or 'installed'}: first bytes {statistics.median(r[0] for r in runs):.3f} s, first frame"
            f" {statistics.median(r[1] for r in runs):.3f} s (medians of {len(runs)})"
        )


if __name__ == "__main__":
    main()
