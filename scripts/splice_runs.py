"""Splice two `localpers bench` runs: a whole run with some of its authors replaced by another run's.

When a change can affect only a few authors (RESULTS 0zn, 0zo: a rule that fires for 3 of 55), those authors are
decoded and fitted again in a small run, and the rest are, by construction, what the whole run wrote. This script
assembles that run: for each method of PART's cache, BASE's per-author cache files with PART's authors replaced,
and the same for outputs.jsonl, into OUT, which `scripts/compare_runs.py` and `scripts/series_queries.py` then
read like any run. It checks that every author PART brings is one of BASE's, so a splice never adds authors.

    python scripts/splice_runs.py ../bench-runs/dev47-a ../bench-runs/dev49-guard-3 ../bench-runs/dev49-spliced
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def splice(base: Path, part: Path, out: Path) -> dict[str, list[str]]:
    """Write OUT from BASE with PART's authors; returns {method: the authors replaced}."""
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} is not empty: give a new folder")
    methods = sorted(folder.name for folder in (part / "cache").iterdir() if folder.is_dir())
    if not methods:
        raise SystemExit(f"{part}/cache holds no method: is it a bench --out folder?")
    replaced: dict[str, list[str]] = {}
    for method in methods:
        source = base / "cache" / method
        if not source.is_dir():
            raise SystemExit(f"{source} does not exist: {base} did not run {method}")
        authors = sorted(path.name for path in (part / "cache" / method).glob("*.json"))
        missing = [name for name in authors if not (source / name).exists()]
        if missing:
            raise SystemExit(f"{part} has authors {base} lacks for {method}: {', '.join(missing)}")
        target = out / "cache" / method
        target.mkdir(parents=True)
        for path in source.glob("*.json"):
            shutil.copyfile(path, target / path.name)
        for name in authors:
            shutil.copyfile(part / "cache" / method / name, target / name)
        # outputs.jsonl names an author by user_id, the cache file by store name ("Alice Smith": alice-smith-...)
        replaced[method] = [_user_id(part / "cache" / method / name) for name in authors]
    _splice_outputs(base / "outputs.jsonl", part / "outputs.jsonl", out / "outputs.jsonl", replaced)
    return replaced


def _user_id(cached: Path) -> str:
    record = json.loads(cached.read_text(encoding="utf-8"))
    return str(record.get("user_id", record["user"]))


def _splice_outputs(base: Path, part: Path, out: Path, replaced: dict[str, list[str]]) -> None:
    """BASE's lines less the replaced (method, author) pairs, then PART's lines of those methods."""
    if not base.exists() or not part.exists():
        return
    gone = {(method, author) for method, authors in replaced.items() for author in authors}
    with out.open("w", encoding="utf-8") as writer:
        for line in base.read_text(encoding="utf-8").splitlines():
            record = json.loads(line) if line.strip() else None
            if record and (record["method"], record["user"]) not in gone:
                writer.write(line + "\n")
        for line in part.read_text(encoding="utf-8").splitlines():
            record = json.loads(line) if line.strip() else None
            if record and record["method"] in replaced:
                writer.write(line + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="the whole run")
    parser.add_argument("part", type=Path, help="a run of some of its authors")
    parser.add_argument("out", type=Path, help="a new folder for the spliced run")
    args = parser.parse_args()
    for method, authors in splice(args.base, args.part, args.out).items():
        print(
            f"{method}: {len(authors)} authors from {args.part} ({', '.join(authors)}), the rest from {args.base}"
        )


if __name__ == "__main__":
    main()
