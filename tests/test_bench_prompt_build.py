"""`scripts/bench_prompt_build.py` runs on a small hand-made author file and prints one line per history size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from synthetic_corpus import bench_item as item

SCRIPT = Path(__file__).parent.parent / "scripts" / "bench_prompt_build.py"


def test_times_the_three_variants_for_each_size(tmp_path: Path) -> None:
    history = [item(n, f"Story {n} about the cat and the bridge.", f"Cat Story {n}") for n in range(1, 21)]
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"user_id": "u1", "history": history}) + "\n")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(data), "--sizes", "5", "10", "--texts", "3", "--repeats", "1"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["5 items", "10 items"]
    assert all(line.count(" ms") == 3 for line in lines)
