"""`scripts/prompt_gate_offline.py` on a hand-made run: gains per query, grouped by the signals' fifths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "prompt_gate_offline.py"
INSTRUCTION = "Generate a headline for the following article: "


def test_history_gain_is_grouped_by_the_closest_items_score(tmp_path: Path) -> None:
    history = [
        {
            "id": "h1",
            "input": INSTRUCTION + "The council voted on the tramway budget.",
            "output": "Tram Budget",
        },
        {"id": "h2", "input": INSTRUCTION + "A chef opened a sourdough bakery.", "output": "New Bakery"},
        {"id": "h3", "input": INSTRUCTION + "Markets fell on Monday.", "output": "Markets Slide"},
        {"id": "h4", "input": INSTRUCTION + "A storm hit the coast.", "output": "Storm Warning"},
    ]
    # Five queries whose closest item scores rise from the first to the last (more words shared with h1).
    articles = [
        "rain",
        "council rain",
        "council tramway rain",
        "council tramway budget",
        "council tramway budget voted",
    ]
    queries = [{"id": f"q{i}", "input": INSTRUCTION + text, "output": "x"} for i, text in enumerate(articles)]
    data = tmp_path / "test.jsonl"
    data.write_text(json.dumps({"user_id": "u1", "history": history, "queries": queries}) + "\n")
    run = tmp_path / "run"
    run.mkdir()
    # The history prompt wins by 0.5 on the least similar query only and loses 0.1 on the most similar one.
    gains = [0.5, 0.0, 0.0, 0.0, -0.1]
    rows = []
    for i, gain in enumerate(gains):
        # Only the last history output repeats one of the shown examples (h1's headline).
        text = "Tram Budget" if i == 4 else "Something Else Entirely"
        rows.append({"user": "u1", "query_id": f"q{i}", "method": "global", "rouge1": 0.2, "text": "Plain"})
        rows.append(
            {
                "user": "u1",
                "query_id": f"q{i}",
                "method": "global-history",
                "rouge1": 0.2 + gain,
                "text": text,
            }
        )
    rows.append(
        {"user": "u1", "query_id": "q0", "method": "card-auto", "rouge1": 0.9, "text": "x"}
    )  # ignored
    for method in (
        "global",
        "global-history",
        "card-auto",
    ):  # the bench's cache, as `localpers bench` writes it
        queries = [row for row in rows if row["method"] == method]
        (run / "cache" / method).mkdir(parents=True)
        (run / "cache" / method / "u1.json").write_text(json.dumps({"user": "u1", "queries": queries}))
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(run), "--data", str(data)],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = result.stdout.splitlines()
    assert lines[0].endswith("5 queries, history - plain R-1 +0.0800 (per-query oracle +0.1000)")
    closest = next(line for line in lines if line.strip().startswith("closest"))
    assert closest.endswith("+0.5000, +0.0000, +0.0000, +0.0000, -0.1000")
    # Falling back to the plain output where the history output resembles no example: the first four texts.
    assert "    plain output below 0.1: -0.1000 R-1, 80% of texts decoded twice" in lines
