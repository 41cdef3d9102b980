"""`scripts/copy_baseline.py` on a hand-made bench file: the closest, most recent and best earlier headlines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from synthetic_corpus import bench_item as item

SCRIPT = Path(__file__).parent.parent / "scripts" / "copy_baseline.py"


def test_scores_the_closest_earlier_headline_not_the_most_recent(tmp_path: Path) -> None:
    history = [
        item(1, "The city council voted on the new tramway budget.", "Council Backs Tramway Budget"),
        item(2, "A chef opened a bakery selling sourdough bread.", "Chef Opens Sourdough Bakery"),
        item(3, "Stock markets fell sharply on Monday morning.", "Markets Slide On Monday"),
    ]
    query = item(4, "The council approved the tramway budget for next year.", "Council Backs Tramway Budget")
    data = tmp_path / "test.jsonl"
    data.write_text(json.dumps({"user_id": "u1", "history": history, "queries": [query]}) + "\n")
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(data)], capture_output=True, text=True, check=True
    )
    first = result.stdout.splitlines()[0]
    # the closest earlier item (by article) carries the very headline; the most recent shares no word with it
    assert first.startswith("1 queries: R-1 of the closest earlier headline 1.0000, the most recent 0.0000")
    assert first.endswith("(oracle) 1.0000")
    assert "closest headline at R-1 >= 0.7: 1 queries" in result.stdout


def test_a_user_without_history_is_one_line_naming_the_line(tmp_path: Path) -> None:
    """The bench accepts such a file; the script ended in "BM25 needs at least one document" (audit89 L1)."""
    query = item(4, "The council approved the tramway budget for next year.", "Council Backs Tramway Budget")
    data = tmp_path / "test.jsonl"
    data.write_text(json.dumps({"user_id": "u1", "history": [], "queries": [query]}) + "\n")
    refused = subprocess.run([sys.executable, str(SCRIPT), str(data)], capture_output=True, text=True)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.strip() == (
        f"{data} line 1: user u1 has no history to copy a headline from: give a file whose authors all have"
        " history items"
    )
