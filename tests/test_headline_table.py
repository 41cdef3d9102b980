"""`scripts/headline_table.py`'s per-author plot on a hand-made bench run: authors without a ratio, and refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "headline_table.py"


def write_method(run: Path, method: str, scores: dict[str, list[float]]) -> None:
    folder = run / "cache" / method
    folder.mkdir(parents=True)
    for user, rouge in scores.items():
        queries = [
            {"query_id": f"q{i}", "rouge1": r, "ms_per_token": 1.0, "prompt_ms": 1.0}
            for i, r in enumerate(rouge)
        ]
        (folder / f"{user}.json").write_text(json.dumps({"user": user, "queries": queries}))


def plot(run: Path, *methods: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        str(SCRIPT),
        str(run),
        *methods,
        "--resamples",
        "200",
        "--plot",
        str(run / "a.png"),
    ]
    return subprocess.run(command, capture_output=True, text=True)


def test_an_author_whose_reference_scored_0_gets_no_bar_and_a_note(tmp_path: Path) -> None:
    """The ratio was divided by max(mean, 1e-9): a bar of about 1e8 that flattened the figure (audit89 L5)."""
    write_method(tmp_path, "global", {"u0": [0.2, 0.4], "u1": [0.0, 0.0]})
    write_method(tmp_path, "card", {"u0": [0.3, 0.3], "u1": [0.2, 0.0]})
    done = plot(tmp_path, "card")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "a.png").is_file()
    assert "note: no ratio for 1 authors whose global scored 0 (bars left out): u1" in done.stdout


def test_a_plotted_method_lacking_an_author_is_one_line(tmp_path: Path) -> None:
    """It was a KeyError traceback (audit89 L1)."""
    write_method(tmp_path, "global", {"u0": [0.2, 0.4], "u1": [0.1, 0.1]})
    write_method(tmp_path, "card", {"u0": [0.3, 0.3]})
    refused = plot(tmp_path, "card")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    (line,) = [line for line in refused.stderr.splitlines() if not line.startswith("note: ")]
    assert line.startswith(f"{tmp_path}/cache/card lacks queries of 1 of global's authors (u1)")
