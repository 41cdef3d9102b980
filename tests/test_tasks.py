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
    assert get_task("free").stop_strings == ()


def test_a_paraphrase_is_one_paragraph_in_and_one_line_out() -> None:
    # without the newline stop the backbone repeated its rewrite line after line until max_tokens
    task = get_task("paraphrase")
    assert task.stop_strings == ("\n",)
    assert task.prompt_for("First line.\n\nSecond   line.") == task.template.format(
        text="First line. Second line."
    )


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


def test_a_one_line_task_writes_from_the_start_of_a_long_text_and_says_so() -> None:
    task = get_task("headline")
    lede = "The council voted to expand bike lanes downtown."
    article = task.instruction + " " + lede + " " + "More details followed in a long report. " * 200
    prompt = task.prompt_for(article)
    content = prompt[len(task.instruction) + 1 : -len("\nHeadline:")]
    assert content.startswith(lede) and content.endswith(" ...")
    assert len(content) <= task.max_input_chars
    kept = content[: -len(" ...")]
    assert task.content(article)[len(kept)] == " "  # cut where a word ends, not inside one
    assert task.is_cut(article)
    task.check_text(article)  # cut, not refused
    short = task.instruction + " " + lede
    assert task.prompt_for(short) == task.template.format(text=lede) and not task.is_cut(short)
    one_long_word = "x" * 5000  # no space to end at: cut at the limit
    assert len(task.prompt_for(one_long_word)) <= task.max_input_chars + len(task.template)


def test_a_task_that_rewrites_the_whole_text_refuses_a_longer_one() -> None:
    from localpers.errors import InputError

    task = get_task("paraphrase")
    assert not task.cuts_long_input
    task.check_text("word " * (task.max_input_chars // 5))
    with pytest.raises(
        InputError, match=r"has 1,499 characters; the paraphrase task takes at most 1,000: split"
    ):
        task.check_text("word " * 300)
    with pytest.raises(InputError, match="at most 950"):  # room for what a method adds (EXACT's line)
        task.check_text("w" * 960, room=50)


def test_outputs_are_bounded_for_import_and_for_scoring() -> None:
    from localpers.errors import InputError

    task = get_task("headline")
    task.check_output("A Headline Of Ordinary Length")
    with pytest.raises(InputError, match="a headline output has at most 300.*swapped"):
        task.check_output("word " * 100)
    assert task.scored_output(" Short one ") == "Short one"
    assert len(task.scored_output("word " * 100)) <= task.max_output_chars


def test_a_cut_without_a_space_nearby_never_splits_a_character() -> None:
    """A run of emoji or NFD kana was cut inside a joined family emoji, a flag's pair or between a letter and
    its voicing mark, turning "が" into "か" (text audit)."""
    import unicodedata

    from localpers.tasks import CUT_MARK, cut_text

    family = "👨\u200d👩\u200d👧\u200d👦"
    assert cut_text(family * 400, 1500).removesuffix(CUT_MARK).endswith(family)
    for limit in (1501, 1502):
        kept = cut_text("🇩🇪🇫🇷" * 500, limit).removesuffix(CUT_MARK)
        assert len(kept) % 2 == 0  # whole flags only
    voiced = unicodedata.normalize("NFD", "が")
    assert cut_text(voiced * 900, 1500).removesuffix(CUT_MARK).endswith(voiced)
    assert cut_text("word " * 400, 100) == "word " * 18 + "word" + CUT_MARK  # at a space, as before
