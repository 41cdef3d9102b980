"""Write a synthetic corpus with N times the authors: each author's history dealt round-robin to N pseudo-authors.

For scaling measurements of the publisher only (`docs/PUBLISHING.md`): the same articles and headlines,
re-split, so the text is real but the "authors" are not. `queries` are dropped. Authors with fewer
than N items give as many pseudo-authors as they have items. Write the output outside the repository.

    python scripts/split_authors.py ../shared/data/news-headlines/train.jsonl /tmp/train-x10.jsonl --factor 10
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def split(source: Path, target: Path, factor: int) -> tuple[int, int]:
    """Write the re-split corpus; returns (authors read, pseudo-authors written)."""
    authors = written = 0
    with source.open(encoding="utf-8") as reader, target.open("w", encoding="utf-8") as writer:
        for line in reader:
            if not line.strip():
                continue
            record = json.loads(line)
            authors += 1
            history = record["history"]
            for part in range(min(factor, len(history))):
                items = history[part::factor]
                pseudo = {"user_id": f"{record['user_id']}-p{part}", "history": items}
                writer.write(json.dumps(pseudo, ensure_ascii=False) + "\n")
                written += 1
    return authors, written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="corpus JSONL, one author per line")
    parser.add_argument("target", type=Path, help="where to write the re-split corpus (outside the repo)")
    parser.add_argument("--factor", type=int, default=10, help="pseudo-authors per author")
    args = parser.parse_args()
    if args.factor < 1:
        parser.error("--factor must be at least 1")
    repo = Path(__file__).resolve().parents[1]
    if args.target.resolve().is_relative_to(repo):
        parser.error(f"write the synthetic corpus outside the repository ({repo})")
    authors, written = split(args.source, args.target, args.factor)
    print(f"{authors} authors -> {written} pseudo-authors in {args.target}")


if __name__ == "__main__":
    main()
