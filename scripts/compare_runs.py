"""Compare methods across `localpers bench` runs (e.g. two bundles) on the same queries, with author-level intervals.

Each argument is RUN_DIR:METHOD (a bench --out folder and a method name in its cache). The first is the
reference. For each other one it prints mean ROUGE-1, the ratio and difference to the reference with a paired
bootstrap 95% interval over queries and one over authors (`localpers.bench.authors`: resampling authors, each
with all their queries), how many authors improved, the mean prompt time and the decode time per token (all
decode time over all tokens, as report.md reads it), and (where both runs scored it) the paired difference in
gold likelihood: each query's mean per-token log-probability of the author's headline.

With --split-half it also asks whether a per-author choice between the two could pay: each author's better of
the two chosen with the answers on all their queries (a ceiling, inflated by noise), and chosen on half of their
queries (alternate ones) and scored on the other half, both ways, against the reference (paired interval). If
authors had a stable preference, the split-half figure would keep much of the ceiling's gain. An author with one
query has no half to choose on: they count in the ceiling, not in the split-half figure (the output says how many).
Usage: python scripts/compare_runs.py ../bench-runs/demo:global ../bench-runs/hist:global-history [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from localpers.bench.authors import compare_authors
from localpers.bench.metrics import Interval, paired_bootstrap


def load(spec: str) -> dict[str, dict[str, dict[str, float]]]:
    """{user: {query_id: {rouge1, ms_per_token, prompt_ms, tokens}}} from one run's cache of one method."""
    run, _, method = spec.rpartition(":")
    if not run or not method or "/" in method:
        raise SystemExit(
            f"{spec}: give RUN_DIR:METHOD, a bench --out folder and a method of it (e.g. runs/a:global)"
        )
    table: dict[str, dict[str, dict[str, float]]] = {}
    fingerprints: dict[str, str | None] = {}
    for record in cache_records(Path(run), method).values():
        user = user_id(record)
        table[user] = {q["query_id"]: q for q in record["queries"]}
        fingerprints[user] = record.get("fingerprint")
    return of_the_run(Path(run), method, table, fingerprints)


def cache_records(run: Path, method: str) -> dict[str, dict]:
    """{file name without .json (the user's store name): record} of one method's cache in a run."""
    folder = run / "cache" / method
    if not folder.is_dir():
        raise SystemExit(f"{folder} does not exist: run the bench with -m {method} --out {run} first")
    records = {}
    for path in sorted(folder.glob("*.json")):
        try:
            records[path.stem] = _read_record(path)
        except (OSError, ValueError) as exc:
            # the bench recomputes such a file (an interrupted older run half-wrote it); a script cannot
            raise SystemExit(
                f"{path}: not a whole cache record ({exc}): rerun the bench with -m {method} --out {run} to write"
                " it again (or delete the file if its user is not of that run)"
            ) from None
    return records


def _read_record(path: Path) -> dict:
    record = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(record, dict) or "user" not in record or not isinstance(record.get("queries"), list):
        raise ValueError("no 'user' and 'queries'")
    if not all(isinstance(query, dict) and "query_id" in query for query in record["queries"]):
        raise ValueError("a query without 'query_id'")
    return record


def user_id(record: dict) -> str:
    """The user a cache record is of, as results.json and outputs.jsonl name them."""
    # the cache file names a user by store name ("Alice Smith" is alice-smith-8ae10dfc there), and an old record
    # may hold only that
    return str(record.get("user_id", record["user"]))


def of_the_run(
    run: Path,
    method: str,
    table: dict[str, dict[str, dict[str, float]]],
    fingerprints: dict[str, str | None] | None = None,
) -> dict:
    """`table` cut to the users of the run's results.json: the cache also keeps an earlier run's users (another
    --max-users or data file), which would mix into the figures; a user cached with another number of queries
    than the run scored, or whose record is not the one results.json's figures came from (a later run into the
    same folder with another configuration rewrote it), is refused. Without a results.json (a run stopped
    early) the cache is taken whole."""
    results = run / "results.json"
    if not results.is_file():
        print(
            f"note: {run} has no results.json (a run stopped early?): every cached user of {method} is read",
            file=sys.stderr,
        )
        return table
    users: dict[str, dict] = json.loads(results.read_text())["users"]
    left_out = sorted(set(table) - set(users))
    if left_out:
        print(
            f"note: {run}:{method}: {len(left_out)} cached users are not of this run (an earlier run's), left out",
            file=sys.stderr,
        )
    for user, summary in users.items():
        if user in table and len(table[user]) != summary.get("queries", len(table[user])):
            raise SystemExit(
                f"{run}/cache/{method}/{user}.json holds {len(table[user])} queries, the run scored"
                f" {summary['queries']}: rerun the bench with -m {method} --out {run}"
            )
        expected = (summary.get("fingerprints") or {}).get(method)
        if user in table and expected and (fingerprints or {}).get(user) != expected:
            raise SystemExit(
                f"{run}/cache/{method}/{user}.json is not the record results.json's figures came from (a later run"
                f" into {run} with another configuration rewrote it): rerun the bench with -m {method} --out {run}"
            )
    return {user: queries for user, queries in table.items() if user in users}


def compare(
    reference: dict,
    other: dict,
    resamples: int,
    seed: int,
    names: tuple[str, str] = ("the reference", "the run"),
) -> dict[str, object]:
    """`other` against `reference` on the queries both scored (`names`: theirs, for the error when there is none)."""
    users = sorted(set(reference) & set(other))
    rows = [(u, q) for u in users for q in sorted(set(reference[u]) & set(other[u]))]
    if not rows:
        raise SystemExit(
            f"{names[0]} and {names[1]} share no scored query (no user id and query id in common): compare runs"
            " of the same data file"
        )
    base = np.array([reference[u][q]["rouge1"] for u, q in rows])
    new = np.array([other[u][q]["rouge1"] for u, q in rows])
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(rows), size=(resamples, len(rows)))
    with np.errstate(divide="ignore", invalid="ignore"):
        query_ratio = new[picks].mean(1) / base[picks].mean(1)
    query_ratio = query_ratio[
        np.isfinite(query_ratio)
    ]  # a draw whose reference mean is 0 has none (as the bench)
    query_diff = (new - base)[picks].mean(1)
    # the author draws continue the same stream, so the figures printed before this call existed reproduce
    authors = compare_authors(new, base, [u for u, _ in rows], n_resamples=resamples, rng=rng)

    def interval(values: list[float] | np.ndarray) -> list[float]:
        if len(values) == 0:  # no draw has a ratio: the reference scored 0 on every query
            return [float("nan"), float("nan")]
        return [round(float(v), 4) for v in np.percentile(values, [2.5, 97.5])]

    def bounds(estimate: Interval) -> list[float]:
        return [round(estimate.low, 4), round(estimate.high, 4)]

    def cost(table: dict, key: str) -> float:
        counted = all("tokens" in table[u][q] for u, q in rows)  # a bench cache's rows all have them
        if key == "ms_per_token" and counted:  # decode time over tokens decoded, as report.md reads it
            tokens = sum(table[u][q]["tokens"] for u, q in rows)
            decode_ms = sum(table[u][q]["ms_per_token"] * table[u][q]["tokens"] for u, q in rows)
            return round(decode_ms / tokens, 2) if tokens else 0.0
        return round(float(np.mean([table[u][q][key] for u, q in rows])), 2)

    gold: dict[str, object] = {}
    if all(table[u][q].get("gold_logprob") is not None for table in (reference, other) for u, q in rows):
        difference = paired_bootstrap(
            [other[u][q]["gold_logprob"] for u, q in rows],
            [reference[u][q]["gold_logprob"] for u, q in rows],
            n_resamples=resamples,
            seed=seed,
        )
        gold = {
            "gold_diff": round(difference.mean, 4),
            "gold_diff_query_ci": [round(difference.low, 4), round(difference.high, 4)],
        }
    return {
        "queries": len(rows),
        "authors": len(users),
        "rouge1_reference": round(float(base.mean()), 4),
        "rouge1": round(float(new.mean()), 4),
        "ratio": round(float(new.mean() / base.mean()), 4),
        "ratio_query_ci": interval(query_ratio),
        "ratio_author_ci": bounds(authors.ratio),
        "diff": round(float((new - base).mean()), 4),
        "diff_query_ci": interval(query_diff),
        "diff_author_ci": bounds(authors.difference),
        "authors_improved": authors.improved_text(),
        "ms_per_token": [cost(reference, "ms_per_token"), cost(other, "ms_per_token")],
        "prompt_ms": [cost(reference, "prompt_ms"), cost(other, "prompt_ms")],
        **gold,
    }


def split_half(reference: dict, other: dict, resamples: int, seed: int) -> dict[str, object]:
    """A per-author choice between `reference` and `other`: its ceiling, and chosen on half, scored on the rest."""
    ceiling: list[float] = []
    held_out: list[float] = []
    chose_other = too_short = 0
    for user in sorted(set(reference) & set(other)):
        ids = sorted(set(reference[user]) & set(other[user]))
        base = np.array([reference[user][q]["rouge1"] for q in ids])
        new = np.array([other[user][q]["rouge1"] for q in ids])
        better = new.mean() > base.mean()
        chose_other += bool(better)
        ceiling += list((new if better else base) - base)
        if len(ids) < 2:  # one half would be empty: nothing to choose on, or nothing to score on
            too_short += 1
            continue
        for half in (0, 1):
            chosen_on = np.arange(len(ids)) % 2 == half
            pick = new[chosen_on].mean() > base[chosen_on].mean()
            held_out += list((new if pick else base)[~chosen_on] - base[~chosen_on])
    difference = (
        paired_bootstrap(held_out, [0.0] * len(held_out), n_resamples=resamples, seed=seed)
        if held_out
        else Interval(float("nan"), float("nan"), float("nan"))  # every author has one query
    )
    return {
        "ceiling_diff": round(float(np.mean(ceiling)), 4),
        "ceiling_authors_choosing_other": chose_other,
        "split_half_diff": round(difference.mean, 4),
        "split_half_ci": [round(difference.low, 4), round(difference.high, 4)],
        "split_half_queries": len(held_out),
        "split_half_authors_left_out": too_short,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="RUN_DIR:METHOD, the reference first")
    parser.add_argument("--resamples", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--split-half", action="store_true", help="also a per-author choice's gain (see above)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    reference = load(args.runs[0])
    report = {}
    for spec in args.runs[1:]:
        other = load(spec)
        report[spec] = compare(reference, other, args.resamples, args.seed, names=(args.runs[0], spec))
        if args.split_half:
            report[spec]["per_author_choice"] = split_half(reference, other, args.resamples, args.seed)
    if args.json:
        print(json.dumps({"reference": args.runs[0], "compared": report}, indent=2))
        return
    print(f"reference {args.runs[0]}")
    for spec, row in report.items():
        print(
            f"{spec}: R-1 {row['rouge1']} vs {row['rouge1_reference']} = {row['ratio']}x "
            f"query CI {row['ratio_query_ci']} author CI {row['ratio_author_ci']}; "
            f"diff {row['diff']:+} {row['diff_query_ci']}; authors improved {row['authors_improved']}; "
            f"ms/token {row['ms_per_token']}, prompt ms {row['prompt_ms']}"
            + (
                f"; gold nats/token {row['gold_diff']:+} {row['gold_diff_query_ci']}"
                if "gold_diff" in row
                else ""
            )
        )
        if "per_author_choice" in row:
            choice = row["per_author_choice"]
            print(
                f"  per-author choice: ceiling {choice['ceiling_diff']:+} ({choice['ceiling_authors_choosing_other']}"
                f" authors take it); chosen on half, scored on the other: {choice['split_half_diff']:+} "
                f"{choice['split_half_ci']} over {choice['split_half_queries']} queries"
                + _left_out(choice["split_half_authors_left_out"])
            )


def _left_out(authors: int) -> str:
    return f" ({authors} authors with one query left out: no half to choose on)" if authors else ""


if __name__ == "__main__":
    main()
