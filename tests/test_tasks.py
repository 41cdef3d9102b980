"""Task templates and their stop rules (no model needed); sampling is tested in test_sampler_chain.py."""

from __future__ import annotations

import pytest

from localpers.errors import LocalpersError
from localpers.tasks import TASKS, get_task


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


def test_one_line_tasks_turn_the_word_rule_on_and_an_explicit_setting_wins() -> None:
    from localpers.engine.decoding import GREEDY, SamplerSettings

    assert {name: task.repeated_word_penalty > 0 for name, task in TASKS.items()} == {
        "headline": True,
        "title": True,
        "paraphrase": False,
        "free": False,
    }
    assert (
        GREEDY.repeated_word_penalty is None and GREEDY.word_penalty == 0.0
    )  # unset: the engine reads it as off
    assert GREEDY.for_task(3.0).word_penalty == 3.0
    assert SamplerSettings(repeated_word_penalty=0.0).for_task(3.0).word_penalty == 0.0
    assert SamplerSettings(repeated_word_penalty=1.5).for_task(3.0).word_penalty == 1.5
