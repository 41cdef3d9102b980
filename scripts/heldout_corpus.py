"""Write a training corpus without each author's dev-split queries, so adapters trained on it never saw them.

`localpers bench --dev-split` takes each train author's most recent items as queries (the cut in
`localpers.bench.data`); this writes the same authors with only the items before that cut, for judging
training choices (epochs, format) on the dev split honestly. Write the output outside the repository.

    python scripts/heldout_corpus.py ../shared/data/news-headlines/train.jsonl /tmp/train-heldout.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from localpers.bench.data import dev_query_count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "source", type=Path, help="train corpus JSONL, one author per line, oldest item first"
    )
    parser.add_argument("target", type=Path, help="where to write the held-out corpus (outside the repo)")
    args = parser.parse_args()
    kept = dropped = 0
    with args.source.open(encoding="utf-8") as reader, args.target.open("w", encoding="utf-8") as writer:
        for line in reader:
            if not line.strip():
                continue
            record = json.loads(line)
            items = [*record["history"], *(record.get("queries") or [])]
            count = dev_query_count(len(items))
            items = items[: len(items) - count]
            kept, dropped = kept + len(items), dropped + count
            writer.write(
                json.dumps({"user_id": record["user_id"], "history": items}, ensure_ascii=False) + "\n"
            )
    print(f"kept {kept} items, left out {dropped} dev queries")


if __name__ == "__main__":
    main()
