"""`scripts/repeat_stats.py` on small hand-made bench caches: repeated words and numbers lost against a reference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "repeat_stats.py"


def write_method(run: Path, method: str, texts: list[str]) -> None:
    folder = run / "cache" / method
    folder.mkdir(parents=True)
    queries = [{"query_id": f"q{i}", "text": text} for i, text in enumerate(texts)]
    (folder / "u0.json").write_text(json.dumps({"user": "u0", "queries": queries}))


def test_counts_repeated_words_and_numbers_lost_against_the_reference(tmp_path: Path) -> None:
    reference, other = tmp_path / "ref", tmp_path / "other"
    write_method(reference, "global", ["Cuts Aid To 100 Million People", "A Plain Headline"])
    write_method(
        reference, "global-history", ["Campaign Is A Big Deal For His campaign", "The Way To The Top"]
    )
    write_method(other, "global@presence=1.0", ["Cuts Aid To 10 Million People", "A Plain Headline"])
    write_method(other, "global-history@presence=1.0", ["Campaign Is A Big Deal", "In 2020 The Way"])
    data = tmp_path / "data.jsonl"
    data.write_text(
        json.dumps({"history": [{"output": "Why Why Why"}, {"output": "Real Real News"}], "queries": []})
        + "\n"
    )
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(reference), str(other), "--data", str(data)],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = {line.split()[0]: line for line in result.stdout.splitlines()}
    # "Why" is a stop word; "Real" is not
    assert "2 outputs  repeat a word 0.500" in lines["authors"]
    assert "repeat a word 0.500  multi-digit numbers changed 0 of 0" in lines["ref:global-history"]
    assert "repeat a word 0.000  multi-digit numbers changed 0 of 1" in lines["ref:global"]
    assert "multi-digit numbers changed 1 of 1" in lines["other:global@presence=1.0"]
    assert (
        "repeat a word 0.000  multi-digit numbers changed 0 of 0"
        in lines["other:global-history@presence=1.0"]
    )
