"""Time a CARD refit after the oldest history item is removed, and a fit with nothing new, against a first fit.

Imports the N earliest items of one author of a per-user corpus file into a fresh user in a throwaway
LOCALPERS_HOME, runs `localpers fit`, removes the oldest item (by id, as every version can), fits again, then
runs `localpers fit` once more with nothing changed.
Run it with PYTHONPATH pointing at another checkout to time that code the same way. Prints one line per fit.

    python scripts/bench_refit_after_removal.py --data ../shared/data/news-headlines/train.jsonl --author u076 --items 80
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def localpers(*args: str, env: dict[str, str]) -> str:
    # run from the throwaway home: `python -m` puts the working directory first on sys.path, so from a checkout
    # it would import that checkout's code, whatever PYTHONPATH says
    done = subprocess.run(
        [sys.executable, "-m", "localpers.cli", *args],
        env=env,
        cwd=env["LOCALPERS_HOME"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"error: localpers {' '.join(args)} failed: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a per-user JSONL file (user_id, history)")
    parser.add_argument("--author", required=True, help="the user_id whose earliest items are imported")
    parser.add_argument("--items", type=int, default=80, help="how many of the author's earliest items")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads (LOCALPERS_THREADS)")
    args = parser.parse_args()
    try:
        lines = args.data.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise SystemExit(f"error: {args.data}: {exc.strerror}") from None
    author = next((json.loads(line) for line in lines if f'"{args.author}"' in line), None)
    if author is None or author.get("user_id") != args.author:
        raise SystemExit(f"error: {args.data} has no user_id {args.author!r}")
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "LOCALPERS_HOME": home, "LOCALPERS_THREADS": str(args.threads)}
        history = Path(home) / "history.jsonl"
        history.write_text(
            "".join(
                json.dumps({"input": item["input"], "output": item["output"]}) + "\n"
                for item in author["history"][: args.items]
            ),
            encoding="utf-8",
        )
        code = localpers("--version", env=env).strip()
        where = subprocess.run(
            [sys.executable, "-c", "import localpers; print(localpers.__file__)"],
            env=env,
            cwd=home,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        print(f"code: {where} ({code})", flush=True)
        localpers("user", "create", "timed", env=env)
        localpers("history", "import", str(history), env=env)
        for label in ("first fit", "refit after removing the oldest", "fit again with nothing new"):
            if label == "refit after removing the oldest":
                oldest = json.loads(localpers("history", "list", "--json", env=env))["items"][0]["id"]
                localpers("history", "remove", oldest, env=env)
            started = time.perf_counter()
            localpers("fit", env=env)
            print(f"{label}: {time.perf_counter() - started:.1f} s ({args.items} items)", flush=True)


if __name__ == "__main__":
    main()
