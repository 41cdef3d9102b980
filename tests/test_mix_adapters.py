"""`scripts/mix_adapters.py`: the mixed file's update is the weighted sum of its adapters' updates."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from localpers.engine.adapters import write_lora_gguf

SCRIPT = Path(__file__).parent.parent / "scripts" / "mix_adapters.py"


def _script():
    spec = importlib.util.spec_from_file_location("mix_adapters", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _update(pairs: dict[str, tuple[np.ndarray, np.ndarray]], alpha: float) -> dict[str, np.ndarray]:
    """What llama.cpp adds to each weight: (alpha / rank) * B @ A."""
    return {name: (alpha / a.shape[0]) * (b @ a) for name, (a, b) in pairs.items()}


def _random_adapter(seed: int, rank: int = 4) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return {
        "blk.0.attn_q.weight": (rng.normal(size=(rank, 8)), rng.normal(size=(6, rank))),
        "blk.1.ffn_up.weight": (rng.normal(size=(rank, 8)), rng.normal(size=(10, rank))),
    }


def test_mixed_file_applies_the_weighted_sum_of_updates(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    mix_adapters = _script()
    adapters = [_random_adapter(seed) for seed in range(3)]
    paths = [write_lora_gguf(tmp_path / f"a{i}.gguf", pairs, alpha=8.0) for i, pairs in enumerate(adapters)]
    out = tmp_path / "mix.gguf"
    subprocess.run(
        [sys.executable, str(SCRIPT), str(out), *map(str, paths), "--weights", "0.5,0.25,0.25"],
        check=True,
        capture_output=True,
    )
    mixed, alpha = mix_adapters.read_lora(out)
    assert alpha == 24.0  # n * alpha, so that alpha / rank is each adapter's own scale
    # The files hold float16, so compare with the float16 round trip of each adapter.
    stored = [mix_adapters.read_lora(path)[0] for path in paths]
    expected = {
        name: sum(w * _update(pairs, 8.0)[name] for w, pairs in zip((0.5, 0.25, 0.25), stored, strict=True))
        for name in adapters[0]
    }
    got = _update(mixed, alpha)
    assert set(got) == set(expected)
    for name, update in expected.items():
        assert mixed[name][0].shape[0] == 12
        np.testing.assert_allclose(got[name], update, rtol=2e-3, atol=2e-3)


def test_adapters_of_other_alphas_are_refused(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    one = write_lora_gguf(tmp_path / "one.gguf", _random_adapter(0), alpha=8.0)
    two = write_lora_gguf(tmp_path / "two.gguf", _random_adapter(1), alpha=16.0)
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "mix.gguf"), str(one), str(two), "--weights", "0.5,0.5"],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert "alphas differ" in result.stderr
    assert not (tmp_path / "mix.gguf").exists()
