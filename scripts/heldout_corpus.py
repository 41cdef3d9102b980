"""Write a training corpus without each author's dev-split queries, so adapters trained on it never saw them.

`localpers bench --dev-split` takes each train author's most recent items as queries after putting the items
oldest first by their dates and dropping items listed twice (`localpers.bench.dev_split.split_for_dev`, which
this script calls, so the two cuts agree); this writes the same authors with only the items before that cut, less
any copy of a dev query listed there under another id, for judging training choices (epochs, format) on the dev
split honestly. Write the output outside the repository.

    python scripts/heldout_corpus.py ../shared/data/news-headlines/train.jsonl /tmp/train-heldout.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from localpers.bench.dev_split import split_for_dev
from localpers.users.history import normalize_text


def held_out(record: dict[str, Any]) -> tuple[list[Any], int, int]:
    """An author's items before the dev split's queries, less copies of those queries; the number of queries and
    of copies left out."""
    split = split_for_dev([*record["history"], *(record.get("queries") or [])])
    answers = {_text(query) for query in split.queries}
    kept = [item for item in split.earlier if _text(item) not in answers]
    return kept, len(split.queries), len(split.earlier) - len(kept)


def _text(item: Any) -> tuple[str, str] | None:
    """An item's article and headline as the bench compares them (None for what is not an item)."""
    if not isinstance(item, dict):
        return None
    return normalize_text(str(item.get("input"))), normalize_text(str(item.get("output")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="train corpus JSONL, one author per line")
    parser.add_argument("target", type=Path, help="where to write the held-out corpus (outside the repo)")
    args = parser.parse_args()
    kept = dropped = copies = 0
    with args.source.open(encoding="utf-8") as reader, args.target.open("w", encoding="utf-8") as writer:
        for line in reader:
            if not line.strip():
                continue
            record = json.loads(line)
            items, queries, copied = held_out(record)
            kept, dropped, copies = kept + len(items), dropped + queries, copies + copied
            writer.write(
                json.dumps({"user_id": record["user_id"], "history": items}, ensure_ascii=False) + "\n"
            )
    also = f" and {copies} earlier copies of them" if copies else ""
    print(f"kept {kept} items, left out {dropped} dev queries{also}")


if __name__ == "__main__":
    main()
