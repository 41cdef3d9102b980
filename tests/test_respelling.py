"""Spelling habits ("&" for "and"): fitted from a user's outputs against the model's, applied to finished text."""

from __future__ import annotations

import pytest

from localpers.methods.card.recasing import FinishingStream, Recasing
from localpers.methods.card.respelling import Respelling, fit_respelling
from localpers.methods.card.token_bias import TokenBias, describe_habits

MODEL = [
    "Trump And Putin Meet In Helsinki",
    "Rain And Wind Close Schools",
    "Fed Raises Rates Again",
]


def test_a_user_who_writes_ampersands_gets_them_where_the_model_writes_and() -> None:
    user = ["Salt & Pepper: A Love Story", "Rock & Roll Never Dies", "Fed Raises Rates Again"]
    habit = fit_respelling(user, MODEL)
    assert habit == Respelling({"and": "&"})
    assert habit.apply("Trump And Putin, and 'And' Too") == "Trump & Putin, & '&' Too"
    assert habit.apply("Android Sandbox Band") == "Android Sandbox Band"  # words, not letters inside them
    assert "writes '&' for 'and'" in habit.describe()


def test_no_habit_without_evidence_or_where_the_model_already_writes_the_same() -> None:
    assert fit_respelling(["Fed Raises Rates", "Stocks Fall"], MODEL) is None  # never wrote the family
    assert (
        fit_respelling(["Bread And Butter", "Cats And Dogs"], MODEL) is None
    )  # the model's form, in any case
    assert fit_respelling(["Bread & Butter", "Cats And Dogs", "Up And Down"], MODEL) is None  # mixed: 1 of 3
    # a model that never wrote the family is taken to write its common form ("and")
    assert fit_respelling(["Bread And Butter"], ["Fed Raises Rates"]) is None
    assert fit_respelling(["Bread & Butter"], ["Fed Raises Rates"]) == Respelling({"and": "&"})


def test_the_reverse_habit_keeps_the_users_own_spelling_and_edge_punctuation() -> None:
    habit = fit_respelling(["Cats And Dogs", "Up And Down"], ["Rock & Roll", "Salt & Pepper"])
    assert habit == Respelling({"and": "And"})
    assert habit.apply("Rock & Roll (&) Forever") == "Rock And Roll (And) Forever"
    versus = fit_respelling(["Yankees vs. Red Sox"], ["Yankees Versus Red Sox"])
    assert versus == Respelling({"versus": "vs"})
    assert versus.apply("Cats Versus Dogs: 'Versus!'") == "Cats vs Dogs: 'vs!'"


def test_stored_with_the_token_bias_finished_with_casing_and_refused_when_malformed() -> None:
    bias = TokenBias(
        first={5: 1.0}, opening={7: 2.0}, recasing=Recasing("lower"), respelling=Respelling({"and": "&"})
    )
    again = TokenBias.from_json(bias.to_json())
    assert again.respelling == bias.respelling and again.recasing == bias.recasing
    assert bias.habits_only().respelling == bias.respelling
    assert bias.finish("Trump And Putin Meet") == "Trump & putin meet"
    assert TokenBias().finish("Trump And Putin") == "Trump And Putin" and not TokenBias().has_text_habits
    assert any("'&' for 'and'" in line for line in describe_habits(bias, str))
    assert TokenBias.from_json({"first": []}).respelling is None
    for bad in ({"and": "plus"}, {"colour": "color"}, {}, ["and", "&"]):
        with pytest.raises(ValueError, match="respelling"):
            TokenBias.from_json({"respelling": bad})


def test_streamed_text_is_respelled_and_adds_up_to_the_whole() -> None:
    bias = TokenBias(respelling=Respelling({"and": "&"}))
    sent: list[str] = []
    stream = FinishingStream(bias.finish, "", sent.append)
    pieces = [" Rock", " An", "d", " Roll", " And"]
    for piece in pieces:
        stream(piece)
    assert "".join(sent) == " Rock & Roll "  # the last word is still being written
    stream.close()
    assert "".join(sent) == bias.finish("".join(pieces))
