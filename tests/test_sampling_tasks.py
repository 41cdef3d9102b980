"""Sampling rules and task templates (no model needed)."""

from __future__ import annotations

import numpy as np
import pytest

from localpers.errors import LocalpersError
from localpers.sampling import SamplingConfig, apply_repetition_penalty, choose_token
from localpers.tasks import TASKS, get_task


def test_greedy_picks_the_largest_logit() -> None:
    assert choose_token(np.array([0.1, 2.0, 0.3]), SamplingConfig()) == 1


def test_top_k_one_is_greedy_even_when_sampling() -> None:
    logits = np.array([0.0, 5.0, 4.9, -1.0])
    config = SamplingConfig(temperature=1.5, top_k=1, seed=3)
    assert {choose_token(logits, config) for _ in range(20)} == {1}


def test_top_p_keeps_only_the_nucleus() -> None:
    logits = np.log(np.array([0.6, 0.3, 0.05, 0.05]))
    rng = np.random.default_rng(0)
    picks = {choose_token(logits, SamplingConfig(temperature=1.0, top_p=0.8), rng=rng) for _ in range(200)}
    assert picks == {0, 1}


def test_sampling_is_reproducible_with_a_seed() -> None:
    logits = np.random.default_rng(1).normal(size=1000)
    config = SamplingConfig(temperature=1.0, seed=42)
    assert [choose_token(logits, config) for _ in range(5)] == [
        choose_token(logits, config) for _ in range(5)
    ]


def test_repetition_penalty_lowers_seen_tokens_only() -> None:
    logits = np.array([2.0, -2.0, 1.0])
    penalised = apply_repetition_penalty(logits, [0, 1], 2.0)
    assert penalised.tolist() == [1.0, -4.0, 1.0]
    assert choose_token(logits, SamplingConfig(repetition_penalty=3.0), previous=[0]) == 2


def test_headline_prompt_accepts_raw_text_and_shared_data_inputs() -> None:
    task = get_task("headline")
    raw = task.prompt_for("A new park opens.")
    from_data = task.prompt_for("Generate a headline for the following article: A new park opens.")
    assert raw == from_data
    assert raw.endswith("Headline:")
    assert task.stop_strings == ("\n",)


def test_every_task_has_a_template_with_the_text() -> None:
    assert {"headline", "title", "paraphrase", "free"} <= set(TASKS)
    for task in TASKS.values():
        assert "some words" in task.prompt_for("some words")
    assert get_task("free").prompt_for("abc") == "abc"
    assert get_task("paraphrase").stop_strings == ()


def test_unknown_task() -> None:
    with pytest.raises(LocalpersError, match="choose one of"):
        get_task("limerick")
