"""`scripts/prompt_choice.py`'s split-half check: a mix chosen on half of a user's queries, scored on the rest."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).parent.parent / "scripts" / "prompt_choice.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("prompt_choice", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mixes(default: list[float], other: list[float]) -> dict[int, dict]:
    return {mix: {"queries": [{"rouge1": r} for r in rouge]} for mix, rouge in ((4, default), (0, other))}


def test_a_user_with_one_query_gives_no_split_half_gain() -> None:
    """One query leaves one half empty: the mix was "chosen" on nan (numpy's "Mean of empty slice") and the
    first mix's gain counted (audit89 L4)."""
    split_half_gains = load_script().split_half_gains
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert split_half_gains(mixes([0.2], [0.6]), default=4) == []
        # two queries: mix 0 wins on each half, and its gain on the other half counts
        assert split_half_gains(mixes([0.2, 0.2], [0.6, 0.4]), default=4) == pytest.approx([0.2, 0.4])
