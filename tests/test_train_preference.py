"""`scripts/train_preference.py`: its preference pairs, its DPO loss and its per-sequence log-probabilities."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent.parent / "scripts" / "train_preference.py"


def _script():
    spec = importlib.util.spec_from_file_location("train_preference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def _write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_pairs_take_the_greedy_or_worst_candidate_and_skip_near_copies(tmp_path: Path) -> None:
    script = _script()
    rows = [
        {
            "prompt": "P1",
            "reference": "Senate Passes The Budget Bill",
            "candidates": ["Budget Bill Passes", "", "Weather Turns Cold Today"],
        },
        {
            "prompt": "P2",
            "reference": "Trump Signs Order",
            "candidates": ["Trump Signs Order", "Something Else Entirely"],
        },
        {"prompt": "P3", "reference": "", "candidates": ["A Headline"]},
    ]
    path = _write_rows(tmp_path / "cands.jsonl", rows)

    greedy = script.read_pairs(path, "greedy", 0.8)
    assert [(p.prompt, p.chosen, p.rejected) for p in greedy] == [
        ("P1", "Senate Passes The Budget Bill", "Budget Bill Passes")
    ]  # P2's greedy headline is the author's own: nothing to prefer; P3 has no headline
    worst = script.read_pairs(path, "worst", 0.8)
    assert [(p.prompt, p.rejected) for p in worst] == [
        ("P1", "Weather Turns Cold Today"),
        ("P2", "Something Else Entirely"),
    ]


def test_a_candidates_file_without_prompts_is_refused_with_its_line(tmp_path: Path) -> None:
    script = _script()
    rows = [
        {"prompt": "P1", "reference": "A B", "candidates": ["C D"]},
        {"reference": "A B", "candidates": ["C D"]},  # written before `generate` recorded prompts
    ]
    path = _write_rows(tmp_path / "old.jsonl", rows)
    with pytest.raises(SystemExit, match=r"old\.jsonl, line 2: no prompt"):
        script.read_pairs(path, "greedy", 0.8)


def test_preference_loss_is_log_2_at_the_reference_and_falls_as_the_margin_grows() -> None:
    torch = pytest.importorskip("torch")
    script = _script()
    reference_chosen = torch.tensor([-10.0, -4.0])
    reference_rejected = torch.tensor([-8.0, -6.0])
    loss, margin = script.preference_loss(
        reference_chosen, reference_rejected, reference_chosen, reference_rejected, beta=0.1
    )
    assert torch.allclose(margin, torch.zeros(2))
    assert torch.allclose(loss, torch.full((2,), math.log(2.0)))
    better, margin = script.preference_loss(
        reference_chosen + 2.0, reference_rejected - 1.0, reference_chosen, reference_rejected, beta=0.1
    )
    assert torch.allclose(margin, torch.full((2,), 3.0))
    assert torch.allclose(better, torch.full((2,), -math.log(1 / (1 + math.exp(-0.3)))))


def test_sequence_logprobs_sum_each_rows_target_tokens() -> None:
    torch = pytest.importorskip("torch")
    script = _script()
    from localpers.engine import torch_model

    vocab = 7

    class TinyLM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = lambda input_ids, attention_mask: type(
                "Out", (), {"last_hidden_state": torch.nn.functional.one_hot(input_ids, vocab).float()}
            )()
            self.lm_head = torch.nn.Linear(vocab, vocab, bias=False)
            self.config = type("Config", (), {})()
            self.anchor = torch.nn.Parameter(torch.zeros(1))

    model = TinyLM()
    with torch.no_grad():
        model.lm_head.weight.copy_(torch.randn(vocab, vocab))
    examples = [
        torch_model.Example(prompt=(1, 2), target=(3, 4)),
        torch_model.Example(prompt=(1,), target=(5, 6, 2)),
    ]
    batch = torch_model.make_batch(examples)
    sums, counts = script.sequence_logprobs(model, batch, 2)
    logprobs = torch.log_softmax(model.lm_head.weight.T, dim=-1)  # row = the previous token
    expected_first = logprobs[2, 3] + logprobs[3, 4]
    expected_second = logprobs[1, 5] + logprobs[5, 6] + logprobs[6, 2]
    assert counts.tolist() == [2.0, 3.0]
    assert torch.allclose(sums, torch.stack([expected_first, expected_second]), atol=1e-5)
