"""Repeated words and changed numbers in bench outputs (RESULTS 0ze): how often a method writes a word twice.

For every method cached in the given run directories (`RUN/cache/<method>/<user>.json`, as `localpers bench` and
`scripts/decode_variants.py` write them) it prints the share of outputs that repeat a word (3 or more letters, not
a stop word, in any casing) and, against the reference run's output for the same query (`global` for methods named
`global` or `global@...`, `global-history` for the others), how many of the outputs whose reference holds a number
of two or more digits lose it. With `--data` it also prints the authors' own headlines' share. It reads outputs
only; it decodes nothing.

Usage: python scripts/repeat_stats.py REFERENCE_RUN [OTHER_RUN ...] [--data ../shared/data/news-headlines/train.jsonl]
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

from localpers.engine.repeated_words import STOP_WORDS

WORD = re.compile(r"[a-z]+")
NUMBER = re.compile(r"\d+")


def repeats_a_word(text: str) -> bool:
    """Whether `text` holds a word of 3+ letters that is not a stop word more than once (any casing)."""
    words = [w for w in WORD.findall(text.lower()) if len(w) >= 3 and w not in STOP_WORDS]
    return any(count > 1 for count in Counter(words).values())


def lost_numbers(reference: str, text: str) -> bool | None:
    """None if `reference` holds no number of 2+ digits; else whether `text` lacks any of them."""
    numbers = {n for n in NUMBER.findall(reference) if len(n) >= 2}
    if not numbers:
        return None
    return not numbers <= set(NUMBER.findall(text))


def load_outputs(folder: Path) -> dict[tuple[str, str], str]:
    """(user, query id) -> output text of one method's cache folder."""
    outputs = {}
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        for query in record["queries"]:
            outputs[(record["user"], query["query_id"])] = query["text"]
    return outputs


def reference_name(method: str) -> str:
    return "global" if method == "global" or method.startswith("global@") else "global-history"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference_run", type=Path)
    parser.add_argument("runs", type=Path, nargs="*")
    parser.add_argument("--data", type=Path, default=None, help="shared-data JSONL: the authors' own share")
    args = parser.parse_args()
    references = {
        name: load_outputs(args.reference_run / "cache" / name) for name in ("global", "global-history")
    }
    if args.data is not None:
        golds = [
            item["output"]
            for line in args.data.read_text().splitlines()
            if line.strip()
            for user in [json.loads(line)]
            for item in user.get("history", []) + user.get("queries", [])
        ]
        share = sum(map(repeats_a_word, golds)) / len(golds)
        print(f"{'authors (' + args.data.name + ')':40s} {len(golds):5d} outputs  repeat a word {share:.3f}")
    for run in [args.reference_run, *args.runs]:
        for folder in sorted(p for p in (run / "cache").iterdir() if p.is_dir()):
            outputs = load_outputs(folder)
            if not outputs:
                continue
            reference = references[reference_name(folder.name)]
            losses = [lost_numbers(reference[key], text) for key, text in outputs.items() if key in reference]
            counted = [loss for loss in losses if loss is not None]
            share = sum(map(repeats_a_word, outputs.values())) / len(outputs)
            print(
                f"{run.name + ':' + folder.name:40s} {len(outputs):5d} outputs  repeat a word {share:.3f}  "
                f"multi-digit numbers changed {sum(counted)} of {len(counted)}"
            )


if __name__ == "__main__":
    main()
