"""`scripts/series_queries.py` on a hand-made bench file and two hand-made runs: where the series rule fires."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from synthetic_corpus import bench_item as item

SCRIPT = Path(__file__).parent.parent / "scripts" / "series_queries.py"


def run(folder: Path, method: str, texts: dict[str, tuple[str, float]]) -> str:
    folder.mkdir()
    with (folder / "outputs.jsonl").open("w") as writer:
        for query_id, (text, score) in texts.items():
            writer.write(
                json.dumps(
                    {"user": "u1", "query_id": query_id, "method": method, "text": text, "rouge1": score}
                )
            )
            writer.write("\n")
    return f"{folder}:{method}"


def test_counts_the_queries_a_series_changes_and_compares_two_runs_on_them(tmp_path: Path) -> None:
    series = [
        item(n, f"My cat did a funny thing number {n}.", f"{n} Funniest Tweets About Cats This Week")
        for n in (1, 2, 3)
    ]
    others = [
        item(n, f"Unrelated story {n} about bridges and rail.", f"Bridge Story {n}") for n in range(4, 10)
    ]
    queries = [
        item(20, "My cat knocked a cup off the table.", "20 Funniest Tweets About Cats This Week"),
        item(21, "Bakery bread wins prize again.", "Bread Wins"),
    ]
    data = tmp_path / "test.jsonl"
    data.write_text(json.dumps({"user_id": "u1", "history": series + others, "queries": queries}) + "\n")
    counted = subprocess.run(
        [sys.executable, str(SCRIPT), str(data)], capture_output=True, text=True, check=True
    )
    assert counted.stdout.strip() == "1 of 2 queries (1 authors: u1) show a series"
    before = run(tmp_path / "a", "m", {"n20": ("Cat Story", 0.1), "n21": ("Bread Wins", 1.0)})
    after = run(tmp_path / "b", "m", {"n20": ("20 Funniest Tweets", 0.5), "n21": ("Bread Wins", 1.0)})
    compared = subprocess.run(
        [sys.executable, str(SCRIPT), str(data), "--runs", before, after],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = compared.stdout.splitlines()
    assert lines[1] == "series shown: 1 queries, R-1 0.1000 -> 0.5000 (+0.4000), 1 outputs differ"
    assert lines[2] == "no series: 1 queries, R-1 1.0000 -> 1.0000 (+0.0000), 0 outputs differ"


def test_an_author_whose_id_is_no_store_name_is_counted_under_series_shown(tmp_path: Path) -> None:
    """outputs.jsonl names authors by user_id; the script looked them up by store name ("Alice Smith" is
    alice-smith-8ae10dfc), so their queries fell under "no series" (audit89 M1)."""
    series = [
        item(n, f"My cat did a funny thing number {n}.", f"{n} Funniest Tweets About Cats This Week")
        for n in (1, 2, 3)
    ]
    others = [
        item(n, f"Unrelated story {n} about bridges and rail.", f"Bridge Story {n}") for n in range(4, 10)
    ]
    query = item(20, "My cat knocked a cup off the table.", "20 Funniest Tweets About Cats This Week")
    data = tmp_path / "test.jsonl"
    record = {"user_id": "Alice Smith", "history": series + others, "queries": [query]}
    data.write_text(json.dumps(record) + "\n")
    runs = []
    for name, text, score in (("a", "Cat Story", 0.1), ("b", "20 Funniest Tweets", 0.5)):
        (tmp_path / name).mkdir()
        line = {"user": "Alice Smith", "query_id": "n20", "method": "m", "text": text, "rouge1": score}
        (tmp_path / name / "outputs.jsonl").write_text(json.dumps(line) + "\n")
        runs.append(f"{tmp_path / name}:m")
    compared = subprocess.run(
        [sys.executable, str(SCRIPT), str(data), "--runs", *runs], capture_output=True, text=True, check=True
    )
    lines = compared.stdout.splitlines()
    assert lines[0] == "1 of 1 queries (1 authors: Alice Smith) show a series"
    assert lines[1:] == ["series shown: 1 queries, R-1 0.1000 -> 0.5000 (+0.4000), 1 outputs differ"]
