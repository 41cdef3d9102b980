"""`scripts/bench_sft.py time`: the publisher's training loop timed on a tiny random model of a recorded config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

SCRIPT = Path(__file__).parent.parent / "scripts" / "bench_sft.py"

TINY_GEMMA3 = {
    "model_type": "gemma3_text",
    "vocab_size": 512,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
}


def test_time_trains_every_setting_on_the_recorded_token_counts(tmp_path: Path) -> None:
    lengths = [[10, 3], [20, 5], [7, 2]]
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps({"lengths": lengths, "config": TINY_GEMMA3}))
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "time",
            "--shapes",
            str(shapes),
            "--device",
            "cpu",
            "--precision",
            "fp32",
        ]
        + ["--batch-sizes", "2", "3", "--steps", "2", "--warmup", "1", "--threads", "1", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = json.loads(result.stdout)
    assert [(row["batch_size"], row["precision"]) for row in rows] == [(2, "fp32"), (3, "fp32")]
    # each timed step trains `batch_size` of the examples, whose token counts are the recorded ones (7-25 here)
    for row in rows:
        examples = row["steps"] * row["batch_size"]
        assert 9 * examples <= row["tokens"] <= 25 * examples
        assert row["tokens_per_second"] > 0 and row["weights"] == "random"
