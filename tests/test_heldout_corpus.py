"""`scripts/heldout_corpus.py`: the train corpus less each author's dev-split queries, cut as the bench cuts it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from localpers.bench.data import read_bench_file

SCRIPT = Path(__file__).parent.parent / "scripts" / "heldout_corpus.py"


def item(number: int) -> dict[str, str]:
    return {
        "id": f"n{number}",
        "date": f"2018-01-{number:02d}",
        "input": f"Generate a headline for the following article: Article number {number} about things.",
        "output": f"Headline {number} Here",
    }


def test_no_dev_query_of_the_bench_is_in_the_held_out_corpus(tmp_path: Path) -> None:
    """The script dropped the last items in file order; the bench sorts by date and drops items listed twice
    first, so for a newest-first author the bench scored adapters on queries they were trained on (audit89 M3)."""
    newest_first = [item(number) for number in range(12, 0, -1)] + [item(12)]  # and the newest listed twice
    oldest_first = [item(number) for number in range(1, 11)]
    corpus = tmp_path / "train.jsonl"
    lines = [{"user_id": "late", "history": newest_first}, {"user_id": "plain", "history": oldest_first}]
    corpus.write_text("".join(json.dumps(line) + "\n" for line in lines))
    target = tmp_path / "heldout.jsonl"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(corpus), str(target)], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "kept 12 items, left out 10 dev queries"
    trained = {
        json.loads(line)["user_id"]: {entry["id"] for entry in json.loads(line)["history"]}
        for line in target.read_text().splitlines()
    }
    for user in read_bench_file(corpus, dev_split=True).users:
        assert trained[user.user_id].isdisjoint(query.id for query in user.queries)
        assert trained[user.user_id] >= {entry.source for entry in user.history}
    assert trained["late"] == {f"n{number}" for number in range(1, 8)}


def test_a_copy_of_a_dev_query_under_another_id_is_left_out_too(tmp_path: Path) -> None:
    items = [item(number) for number in range(1, 11)]
    corpus = tmp_path / "train.jsonl"
    copy = {**items[-1], "id": "copy", "date": "2018-01-01"}  # the newest item again, dated first
    corpus.write_text(json.dumps({"user_id": "u", "history": [copy, *items]}) + "\n")
    target = tmp_path / "heldout.jsonl"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(corpus), str(target)], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "kept 5 items, left out 5 dev queries and 1 earlier copies of them"
    (written,) = [json.loads(line) for line in target.read_text().splitlines()]
    assert [entry["id"] for entry in written["history"]] == ["n1", "n2", "n3", "n4", "n5"]
