"""Time `engine.context_bound.tokens_within_context` on texts that cannot fit the context, and on one that can.

llama.cpp's tokenizer slows with the square of a long newline-dense text; the API gives a long free text or chat
to it while holding the engine. This prints, for each kind of text, its length, whether it was refused and the
seconds it took, next to the seconds a whole `Engine.tokenize` of the same text takes (`--whole`, slow: up to half
a minute for the 100,000 characters of line breaks).

Usage: python scripts/bench_long_texts.py [--threads 2] [--whole]
"""

from __future__ import annotations

import argparse
import time

from localpers.engine import Engine
from localpers.engine.backbone import resolve_backbone
from localpers.engine.context_bound import tokens_within_context
from localpers.errors import TextTooLong

TEXTS = {
    "prose, 4 KB (fits)": "The council voted to rebuild the old bridge. " * 90,
    'a compact opening, then "a\\n" to 49 KB': " " * 4000 + "a\n" * 22_500,
    '"a\\n" x 50,000 (100 KB)': "a\n" * 50_000,
    "4 MB of spaces": " " * 4_000_000,
    "49 KB of line breaks": "\n" * 49_000,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--whole", action="store_true", help="also time a whole tokenize of each text")
    args = parser.parse_args()
    engine = Engine(resolve_backbone().path, n_threads=args.threads)
    print(f"| text | characters | bounded | seconds |{' whole tokenize, s |' if args.whole else ''}")
    print(f"|---|---:|---|---:|{'---:|' if args.whole else ''}")
    for name, text in TEXTS.items():
        started = time.perf_counter()
        try:
            outcome = f"{len(tokens_within_context(engine, text))} tokens"
        except TextTooLong:
            outcome = "refused"
        seconds = time.perf_counter() - started
        whole = ""
        if args.whole:
            started = time.perf_counter()
            engine.tokenize(text)
            whole = f" {time.perf_counter() - started:.2f} |"
        print(f"| {name} | {len(text):,} | {outcome} | {seconds:.3f} |{whole}")


if __name__ == "__main__":
    main()
