"""Benchmark: how long the commands that run no model take to start, each in a fresh process.

Times `localpers --help`, `localpers user list`, `localpers history list` and one completion TAB
(`localpers rewrite --method <TAB>`) against a throwaway LOCALPERS_HOME with one user, and, as the floor, a Typer
app of two commands with one option each (Typer loads pydantic for its options). With `--tree DIR ...` it times
the `localpers` package of each source checkout instead of the installed one (DIR goes first on PYTHONPATH; run
`python -m compileall DIR/localpers` first so both sides read bytecode), rounds interleaving the trees. Prints
medians in seconds; run it on a quiet machine.

Usage: python scripts/bench_startup.py [--rounds 9] [--tree DIR ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

COMMANDS: dict[str, list[str]] = {
    "--help": ["--help"],
    "user list": ["user", "list"],
    "history list": ["history", "list", "--user", "ann"],
    "completion TAB": [],
}
TAB = {"_LOCALPERS_COMPLETE": "complete_bash", "COMP_WORDS": "localpers rewrite --method ", "COMP_CWORD": "3"}
FLOOR = (
    "import typer\n"
    "app = typer.Typer()\n"
    "@app.command()\n"
    "def a(n: int = 1) -> None: ...\n"
    "@app.command()\n"
    "def b(name: str = '') -> None: ...\n"
    "app(['--help'], prog_name='floor')\n"
)
# The console script's own code, run by a file named `localpers` (Typer names the completion variable after it).
LAUNCHER = "from localpers.cli.entry import main\nmain()\n"


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--tree", action="append", default=[], help="a source checkout to time (repeatable)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        launcher = os.path.join(scratch, "localpers")
        with open(launcher, "w", encoding="utf-8") as file:
            file.write(LAUNCHER)
        base = {**os.environ, "LOCALPERS_HOME": os.path.join(scratch, "home")}
        base.pop("LOCALPERS_MODEL", None)
        sides = {tree: {**base, "PYTHONPATH": tree} for tree in args.tree} or {"installed": base}
        for env in sides.values():
            subprocess.run([sys.executable, launcher, "user", "create", "ann"], env=env, capture_output=True)
        for _ in range(args.rounds):
            for side, env in sides.items():
                for name, argv in COMMANDS.items():
                    command_env = {**env, **TAB} if name == "completion TAB" else env
                    times.setdefault(f"{side}: {name}", []).append(
                        timed([sys.executable, launcher, *argv], command_env)
                    )
            times.setdefault("Typer floor (two commands)", []).append(
                timed([sys.executable, "-c", FLOOR], base)
            )
    medians = {name: round(statistics.median(values), 3) for name, values in times.items()}
    if args.json:
        print(json.dumps(medians, indent=2))
        return
    for name, value in medians.items():
        print(f"{name:<50} {value:.3f} s")


if __name__ == "__main__":
    main()
