"""Splice two `localpers bench` runs: a whole run with some of its authors replaced by another run's.

When a change can affect only a few authors (RESULTS 0zn, 0zo: a rule that fires for 3 of 55), those authors are
decoded and fitted again in a small run, and the rest are, by construction, what the whole run wrote. This script
assembles that run: for each method of PART's cache, BASE's per-author cache files with PART's authors replaced,
and the same for outputs.jsonl, into OUT, which `scripts/compare_runs.py` and `scripts/series_queries.py` then
read like any run. It checks that every author PART brings is one of BASE's, so a splice never adds authors.
Only the users of each run are read, as `compare_runs.py` reads them (by the run's results.json: a cache also
keeps an earlier run's users left in the same folder), and OUT gets a results.json holding the users table those
readers filter by (each user's queries and cache-record fingerprints, PART's for its authors), no figures. A run
without a results.json (stopped early) is read whole, with a note.

    python scripts/splice_runs.py ../bench-runs/dev47-a ../bench-runs/dev49-guard-3 ../bench-runs/dev49-spliced
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from compare_runs import cache_records, of_the_run, user_id


def splice(base: Path, part: Path, out: Path) -> dict[str, list[str]]:
    """Write OUT from BASE with PART's authors; returns {method: the authors replaced}."""
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} is not empty: give a new folder")
    methods = sorted(folder.name for folder in (part / "cache").iterdir() if folder.is_dir())
    if not methods:
        raise SystemExit(f"{part}/cache holds no method: is it a bench --out folder?")
    users = _users_table(base)
    replaced: dict[str, list[str]] = {}
    for method in methods:
        if not (base / "cache" / method).is_dir():
            raise SystemExit(f"{base / 'cache' / method} does not exist: {base} did not run {method}")
        kept, brought = run_files(base, method), run_files(part, method)
        missing = sorted(set(brought) - set(kept))
        if missing:
            raise SystemExit(f"{part} has authors {base} lacks for {method}: {', '.join(missing)}")
        target = out / "cache" / method
        target.mkdir(parents=True)
        for path in {**kept, **brought}.values():
            shutil.copyfile(path, target / path.name)
        replaced[method] = sorted(brought)
        if users is not None:
            _replace_rows(users, method, brought, base)
    _splice_outputs(base / "outputs.jsonl", part / "outputs.jsonl", out / "outputs.jsonl", replaced)
    if users is not None:
        spliced = {"base": str(base), "part": str(part), "replaced": replaced}
        (out / "results.json").write_text(json.dumps({"spliced": spliced, "users": users}, indent=2) + "\n")
    return replaced


def run_files(run: Path, method: str) -> dict[str, Path]:
    """{user_id: cache file} of the users of the run (`compare_runs.of_the_run`'s rule: not an earlier run's
    users left in the same folder, and only the records its results.json's figures came from)."""
    records = cache_records(run, method)
    table = {user_id(record): {q["query_id"]: q for q in record["queries"]} for record in records.values()}
    fingerprints = {user_id(record): record.get("fingerprint") for record in records.values()}
    scored = of_the_run(run, method, table, fingerprints)
    folder = run / "cache" / method
    return {user_id(r): folder / f"{name}.json" for name, r in records.items() if user_id(r) in scored}


def _users_table(base: Path) -> dict[str, dict] | None:
    """BASE's results.json users table, cut to what readers filter the cache by (None without one)."""
    results = base / "results.json"
    if not results.is_file():
        return None
    users = json.loads(results.read_text(encoding="utf-8"))["users"]
    # a row without a query count (an older results.json) stays without one: readers then take the cache's count
    return {
        user: {
            **({"queries": row["queries"]} if row.get("queries") is not None else {}),
            "fingerprints": dict(row.get("fingerprints") or {}),
        }
        for user, row in users.items()
    }


def _replace_rows(users: dict[str, dict], method: str, brought: dict[str, Path], base: Path) -> None:
    """The users table's rows for PART's authors: their records' fingerprints, for the same number of queries."""
    for user, path in brought.items():
        record = json.loads(path.read_text(encoding="utf-8"))
        row = users[user]
        if row.get("queries") is not None and len(record["queries"]) != row["queries"]:
            raise SystemExit(
                f"{path} holds {len(record['queries'])} queries, {base}'s run scored {row['queries']} for {user}:"
                " splice runs of the same data file and --max-queries"
            )
        row["fingerprints"][method] = record.get("fingerprint")


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
