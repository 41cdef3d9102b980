"""`scripts/compare_runs.py` on two small hand-made bench caches: ROUGE and gold-likelihood differences."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "compare_runs.py"


def write_run(run: Path, method: str, rouge: list[float], gold: list[float | None]) -> None:
    folder = run / "cache" / method
    folder.mkdir(parents=True)
    for user in ("u0", "u1"):
        queries = [
            {
                "query_id": f"q{i}",
                "rouge1": rouge[i],
                "ms_per_token": 10.0,
                "prompt_ms": 100.0,
                "gold_logprob": gold[i],
            }
            for i in range(len(rouge))
        ]
        (folder / f"{user}.json").write_text(json.dumps({"user": user, "queries": queries}))


def compare(reference: str, other: str) -> dict:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), reference, other, "--json", "--resamples", "200"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout)["compared"][other]


def test_gold_difference_is_paired_per_query(tmp_path: Path) -> None:
    write_run(tmp_path / "a", "m", [0.1, 0.3], [-3.0, -2.0])
    write_run(tmp_path / "b", "m", [0.2, 0.3], [-2.5, -2.1])
    row = compare(f"{tmp_path / 'a'}:m", f"{tmp_path / 'b'}:m")
    assert row["diff"] == 0.05
    assert row["gold_diff"] == 0.2
    low, high = row["gold_diff_query_ci"]
    assert -0.1 <= low <= 0.2 <= high <= 0.5


def test_gold_difference_is_left_out_when_a_run_has_none(tmp_path: Path) -> None:
    write_run(tmp_path / "a", "m", [0.1, 0.3], [None, None])
    write_run(tmp_path / "b", "m", [0.2, 0.3], [-2.5, -2.1])
    row = compare(f"{tmp_path / 'a'}:m", f"{tmp_path / 'b'}:m")
    assert "gold_diff" not in row


def test_split_half_choice_keeps_a_stable_preference_and_not_a_noisy_one(tmp_path: Path) -> None:
    """u0 is better with b on every query (the choice keeps it); u1 is better with b on one half and worse on the
    other (chosen on either half, it loses on the rest)."""
    for run, rows in (
        ("a", {"u0": [0.1] * 4, "u1": [0.2] * 4}),
        ("b", {"u0": [0.3] * 4, "u1": [0.4, 0.0, 0.4, 0.0]}),
    ):
        folder = tmp_path / run / "cache" / "m"
        folder.mkdir(parents=True)
        for user, rouge in rows.items():
            queries = [
                {"query_id": f"q{i}", "rouge1": r, "ms_per_token": 1.0, "prompt_ms": 1.0}
                for i, r in enumerate(rouge)
            ]
            (folder / f"{user}.json").write_text(json.dumps({"user": user, "queries": queries}))
    result = subprocess.run(
        [sys.executable, str(SCRIPT), f"{tmp_path / 'a'}:m", f"{tmp_path / 'b'}:m", "--split-half", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    choice = json.loads(result.stdout)["compared"][f"{tmp_path / 'b'}:m"]["per_author_choice"]
    assert (
        choice["ceiling_authors_choosing_other"] == 1
    )  # u1's mean is 0.2 either way: a tie keeps the reference
    assert choice["ceiling_diff"] == 0.1  # u0's +0.2 on 4 of 8 queries
    # u0: +0.2 on all 4 held-out queries; u1: b chosen on q0/q2 (0.4) loses 0.2 on q1/q3 (0.0), a chosen on q1/q3
    # changes nothing on q0/q2: (0.8 - 0.4) / 8, half the ceiling
    assert choice["split_half_diff"] == 0.05
    assert choice["split_half_queries"] == 8


def test_only_the_users_of_the_runs_results_are_compared(tmp_path: Path) -> None:
    """Bench audit (eightieth session): the cache keeps an earlier run's users (a run with more --max-users), and
    the scripts read it whole, so their figures could differ from the run's own results.json without a word."""
    for run, rouge in (("a", [0.1, 0.3]), ("b", [0.2, 0.3])):
        write_run(tmp_path / run, "m", rouge, [None, None])
        results = {
            "users": {"u0": {"queries": 2}}
        }  # this run scored u0 only; u1 is cached from an earlier one
        (tmp_path / run / "results.json").write_text(json.dumps(results))
    row = compare(f"{tmp_path / 'a'}:m", f"{tmp_path / 'b'}:m")
    assert row["authors"] == 1 and row["queries"] == 2
    (tmp_path / "b" / "results.json").write_text(json.dumps({"users": {"u0": {"queries": 3}}}))
    refused = subprocess.run(
        [sys.executable, str(SCRIPT), f"{tmp_path / 'a'}:m", f"{tmp_path / 'b'}:m", "--json"],
        capture_output=True,
        text=True,
    )
    assert refused.returncode != 0 and "holds 2 queries, the run scored 3" in refused.stderr


def test_ms_per_token_is_decode_time_over_tokens_as_the_report_computes_it(tmp_path: Path) -> None:
    """compare_runs averaged each query's rate, which weighs a short output as much as a long one; report.md and
    the cost target divide all decode time by all tokens."""
    for run, rates in (("a", [10.0, 10.0]), ("b", [10.0, 40.0])):
        folder = tmp_path / run / "cache" / "m"
        folder.mkdir(parents=True)
        queries = [
            {"query_id": f"q{i}", "rouge1": 0.2, "ms_per_token": rate, "prompt_ms": 1.0, "tokens": tokens}
            for i, (rate, tokens) in enumerate(zip(rates, (9, 1), strict=True))
        ]
        (folder / "u0.json").write_text(json.dumps({"user": "u0", "queries": queries}))
    row = compare(f"{tmp_path / 'a'}:m", f"{tmp_path / 'b'}:m")
    assert row["ms_per_token"] == [10.0, 13.0]  # (9 x 10 + 1 x 40) / 10, not the rates' mean of 25


def test_authors_whose_user_id_is_no_store_name_are_compared(tmp_path: Path) -> None:
    """results.json names authors by user_id and the cache by store name: every "Alice Smith" was left out as an
    earlier run's, then "no queries to compare" (audit85)."""
    for run, score in (("a", 0.1), ("b", 0.3)):
        folder = tmp_path / run / "cache" / "m"
        folder.mkdir(parents=True)
        query = {"query_id": "q1", "rouge1": score, "ms_per_token": 10.0, "prompt_ms": 100.0}
        record = {
            "user": "alice-smith-8ae10dfc",
            "user_id": "Alice Smith",
            "queries": [query, {**query, "query_id": "q2"}],
        }
        (folder / "alice-smith-8ae10dfc.json").write_text(json.dumps(record))
        results = {"users": {"Alice Smith": {"queries": 2}}}
        (tmp_path / run / "results.json").write_text(json.dumps(results))
    assert compare(f"{tmp_path / 'a'}:m", f"{tmp_path / 'b'}:m")["diff"] == 0.2


def test_a_cache_record_a_later_run_rewrote_is_refused(tmp_path: Path) -> None:
    """Bench audit (eighty-seventh session): a run with another --history-limit into the same --out rewrote a
    cache file under the same method name; the scripts mixed it with the figures results.json has."""
    for run in ("a", "b"):
        write_run(tmp_path / run, "m", [0.1, 0.3], [None, None])
        for user in ("u0", "u1"):
            record_path = tmp_path / run / "cache" / "m" / f"{user}.json"
            record = json.loads(record_path.read_text())
            record_path.write_text(json.dumps({**record, "fingerprint": f"fp-{user}"}))
        users = {user: {"queries": 2, "fingerprints": {"m": f"fp-{user}"}} for user in ("u0", "u1")}
        (tmp_path / run / "results.json").write_text(json.dumps({"users": users}))
    assert compare(f"{tmp_path / 'a'}:m", f"{tmp_path / 'b'}:m")["authors"] == 2
    rewritten = tmp_path / "b" / "cache" / "m" / "u1.json"
    rewritten.write_text(json.dumps({**json.loads(rewritten.read_text()), "fingerprint": "another run's"}))
    refused = subprocess.run(
        [sys.executable, str(SCRIPT), f"{tmp_path / 'a'}:m", f"{tmp_path / 'b'}:m", "--json"],
        capture_output=True,
        text=True,
    )
    assert (
        refused.returncode != 0
        and "u1.json is not the record results.json's figures came from" in refused.stderr
    )


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def one_line_error(refused: subprocess.CompletedProcess[str]) -> str:
    """The error a refused run ends with, after checking it is one line after the notes and no traceback."""
    lines = refused.stderr.splitlines()
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert all(line.startswith("note: ") for line in lines[:-1]), refused.stderr
    return lines[-1]


def test_a_cut_short_cache_file_is_one_line_naming_it(tmp_path: Path) -> None:
    """The bench recomputes a half-written cache file; the script ended in a JSONDecodeError traceback (audit89)."""
    write_run(tmp_path / "a", "m", [0.1, 0.3], [None, None])
    write_run(tmp_path / "b", "m", [0.2, 0.3], [None, None])
    damaged = tmp_path / "b" / "cache" / "m" / "u1.json"
    damaged.write_text('{"user": "u1", "queri')
    refused = run_script(f"{tmp_path / 'a'}:m", f"{tmp_path / 'b'}:m")
    error = one_line_error(refused)
    assert error.startswith(f"{damaged}: not a whole cache record")
    assert f"rerun the bench with -m m --out {tmp_path / 'b'}" in error


def test_runs_sharing_no_user_are_one_line(tmp_path: Path) -> None:
    write_run(tmp_path / "a", "m", [0.1, 0.3], [None, None])
    (tmp_path / "b" / "cache" / "m").mkdir(parents=True)
    query = {"query_id": "q0", "rouge1": 0.2, "ms_per_token": 1.0, "prompt_ms": 1.0}
    (tmp_path / "b" / "cache" / "m" / "u9.json").write_text(json.dumps({"user": "u9", "queries": [query]}))
    error = one_line_error(run_script(f"{tmp_path / 'a'}:m", f"{tmp_path / 'b'}:m"))
    assert "share no scored query" in error and f"{tmp_path / 'b'}:m" in error


def test_split_half_leaves_out_an_author_with_one_query(tmp_path: Path) -> None:
    """One query gives one empty half: it "chose" on nan (numpy's "Mean of empty slice") and added a zero gain."""
    for run, rows in (("a", {"u0": [0.1] * 2, "solo": [0.2]}), ("b", {"u0": [0.3] * 2, "solo": [0.6]})):
        folder = tmp_path / run / "cache" / "m"
        folder.mkdir(parents=True)
        for user, rouge in rows.items():
            queries = [
                {"query_id": f"q{i}", "rouge1": r, "ms_per_token": 1.0, "prompt_ms": 1.0}
                for i, r in enumerate(rouge)
            ]
            (folder / f"{user}.json").write_text(json.dumps({"user": user, "queries": queries}))
    result = run_script(f"{tmp_path / 'a'}:m", f"{tmp_path / 'b'}:m", "--split-half", "--json")
    assert result.returncode == 0 and "Mean of empty slice" not in result.stderr, result.stderr
    choice = json.loads(result.stdout)["compared"][f"{tmp_path / 'b'}:m"]["per_author_choice"]
    assert choice["split_half_authors_left_out"] == 1 and choice["split_half_queries"] == 2
    assert choice["split_half_diff"] == 0.2 and choice["ceiling_authors_choosing_other"] == 2
    printed = run_script(f"{tmp_path / 'a'}:m", f"{tmp_path / 'b'}:m", "--split-half")
    assert "(1 authors with one query left out: no half to choose on)" in printed.stdout
