"""The casing habit applied to finished words: fitting, applying, streaming, storing."""

from __future__ import annotations

import pytest

from localpers.bench.styles import sentence_case
from localpers.methods.card.recasing import (
    FinishingStream,
    Recasing,
    fit_recasing,
    input_names,
)
from localpers.methods.card.token_bias import TokenBias, describe_habits

TITLE = [
    "Trump Says He Will Veto The Bill",
    "Senate Passes NFL Concussion Bill In Late Vote",
    "Why Obama Left The White House Early",
    "The Best Movies Of 2017 According To Critics",
    "Here Is What Happens Next In Texas",
]
INPUTS = [
    "On Monday President Trump said that he would veto the bill.",
    "The Senate passed a bill on the NFL.",
    "Former president Obama left early.",
    "Critics chose their movies.",
    "What happens in Texas next.",
]
# A real sentence-case writer keeps names capitalised.
NAMED = [
    "Trump says he will veto the bill",
    "Senate passes NFL concussion bill in late vote",
    "Why Obama left the White House early",
    "The best movies of 2017, according to critics",
    "Here is what happens next in Texas",
]


def test_a_synthetic_sentence_case_writer_gets_exactly_the_transform() -> None:
    styled = [sentence_case(t) for t in TITLE]
    habit = fit_recasing(styled * 3, INPUTS * 3, TITLE * 3)
    assert habit == Recasing("lower", frozenset(), names_from_input=False)
    for title, source in zip(TITLE, INPUTS, strict=True):
        assert habit.apply(title, source) == sentence_case(title)


def test_names_the_user_capitalises_are_kept() -> None:
    habit = fit_recasing(NAMED * 3, INPUTS * 3, TITLE * 3)
    assert habit is not None and habit.mode == "lower"
    assert {"obama", "white", "house", "texas"} <= habit.exceptions
    assert habit.apply("Obama Returns To Texas", "") == "Obama returns to Texas"


def test_names_from_the_input_are_kept_when_the_user_keeps_them() -> None:
    habit = Recasing("lower", frozenset(), names_from_input=True)
    source = "On Tuesday the mayor of Springfield met Lisa Simpson. Nothing happened."
    assert input_names(source) == {"tuesday", "springfield", "lisa", "simpson"}
    assert habit.apply("Mayor Meets Lisa Simpson In Springfield", source) == (
        "Mayor meets Lisa Simpson in Springfield"
    )


def test_a_title_case_writer_gets_capitalised_words_except_their_small_words() -> None:
    titles = [
        "Trump Says He Will Veto the Bill",
        "Senate Passes a Concussion Bill in Late Vote",
        "Why Obama Left the White House Early",
        "The Best Movies of 2017 According to Critics",
        "Here Is What Happens Next in Texas",
    ]
    habit = fit_recasing(titles * 3, INPUTS * 3, NAMED * 3)
    assert habit is not None and habit.mode == "upper"
    assert {"the", "a", "in", "of", "to"} <= habit.exceptions
    assert (
        habit.apply("why the senate voted in a hurry (again)", "")
        == "why the Senate Voted in a Hurry (Again)"
    )


def test_no_habit_when_the_user_writes_like_the_model_or_shows_too_little() -> None:
    assert fit_recasing(TITLE * 3, INPUTS * 3, TITLE * 3) is None
    assert fit_recasing(NAMED * 3, INPUTS * 3, NAMED * 3) is None
    assert fit_recasing(NAMED[:2], INPUTS[:2], TITLE[:2]) is None  # under 20 cased words


def test_a_constant_habit_is_found_when_the_model_drifts_most_of_the_way_towards_it() -> None:
    styled = [sentence_case(t) for t in TITLE] * 4
    # the model's y- for the user's sentence-case prompts: 3 of 4 outputs already in sentence case
    drifted = [sentence_case(t) for t in TITLE] * 3 + TITLE
    habit = fit_recasing(styled, INPUTS * 4, drifted)
    assert habit is not None and habit.mode == "lower"  # 1.0 against ~0.75: short of the 0.3 margin
    assert fit_recasing(styled, INPUTS * 4, styled) is None  # the model already keeps it


def test_first_words_acronyms_numbers_and_spacing_are_untouched() -> None:
    habit = Recasing("lower")
    assert habit.apply("  Watch: NFL Star's 2 \u201cBig\u201d Wins\n", "") == (
        "  Watch: NFL star's 2 \u201cbig\u201d wins\n"
    )
    assert habit.apply("", "") == ""


def test_the_first_word_is_the_first_with_a_letter_or_a_digit() -> None:
    habit = Recasing("lower")
    assert habit.apply("\U0001f525 Zoo Opens 4th Giraffe") == "\U0001f525 Zoo opens 4th giraffe"
    assert habit.apply("\u00ab Zoo \u00bb : Une Girafe") == "\u00ab Zoo \u00bb : une girafe"
    assert habit.apply("\u00bf Qu\u00e9 Pasa En El Zoo?") == "\u00bf Qu\u00e9 pasa en el zoo?"
    assert habit.apply(" \u00a1 \u2014 Zoo Opens") == " \u00a1 \u2014 Zoo opens"
    assert Recasing("upper").apply("\U0001f525 zoo opens") == "\U0001f525 zoo Opens"
    # as before: a number is a first word, a symbol after the first word changes nothing, no word no change
    assert habit.apply("5 Things To Know") == "5 things to know"
    assert habit.apply("Zoo \U0001f525 Opens") == "Zoo \U0001f525 opens"
    assert habit.apply("\U0001f525 \u2014") == "\U0001f525 \u2014"


def test_quotes_around_a_word_are_edge_punctuation() -> None:
    habit = Recasing("lower", frozenset({"zoo"}))
    assert habit.apply("Un \u00abZoo\u00bb \u201eBerlin\u201c \u00bfQu\u00e9?") == (
        "Un \u00abZoo\u00bb \u201eberlin\u201c \u00bfqu\u00e9?"
    )
    assert Recasing("upper").apply("un \u00abzoo\u00bb \u300cberlin\u300d") == (
        "un \u00abZoo\u00bb \u300cBerlin\u300d"
    )


def test_a_leading_emoji_is_not_fitted_as_the_first_word() -> None:
    # the word after the emoji is the first word: "Trump", "Senate", "Why" are no exceptions to sentence case
    styled = ["\U0001f525 " + sentence_case(t) for t in TITLE]
    habit = fit_recasing(styled * 3, INPUTS * 3, TITLE * 3)
    assert habit == Recasing("lower", frozenset(), names_from_input=False)


def test_streamed_text_is_recased_word_by_word_and_adds_up_to_the_whole() -> None:
    habit = Recasing("lower")
    sent: list[str] = []
    stream = FinishingStream(habit.apply, "", sent.append)
    pieces = [" Trump", " Sa", "ys", " He", " Will", " Veto", " The", " Bill"]
    for piece in pieces:
        stream(piece)
    assert "".join(sent) == " Trump says he will veto the "  # the last word is still being written
    stream.close()
    assert "".join(sent) == habit.apply("".join(pieces))


def test_stored_with_the_token_bias_and_named_in_the_fit_report() -> None:
    habit = Recasing("lower", frozenset({"obama"}), names_from_input=True)
    bias = TokenBias(first={5: 1.0}, recasing=habit)
    again = TokenBias.from_json(bias.to_json())
    assert again.recasing == habit and again.first == {5: 1.0}
    assert TokenBias.from_json({"first": []}).recasing is None
    assert "sentence case" in " ".join(describe_habits(bias, str))


LOWER = [t.lower() for t in NAMED]  # "senate passes nfl concussion bill in late vote"
CAPITALS = [t.upper() for t in NAMED]  # "SENATE PASSES NFL CONCUSSION BILL IN LATE VOTE"


def test_an_all_lower_case_writer_gets_every_word_lower_cased_the_first_and_acronyms_too() -> None:
    habit = fit_recasing(LOWER * 3, INPUTS * 3, TITLE * 3)
    assert habit == Recasing("all-lower")
    assert fit_recasing(LOWER * 3, INPUTS * 3, NAMED * 3) == Recasing("all-lower")  # a sentence-case model
    assert habit.apply("\U0001f525 Zoo Opens To NFL Star's \u201cBig\u201d Giraffe\n", "Zoo") == (
        "\U0001f525 zoo opens to nfl star's \u201cbig\u201d giraffe\n"
    )
    for title in TITLE:
        assert habit.apply(title) == title.lower()
    assert habit.apply(NAMED[2]) == LOWER[2]


def test_an_all_caps_writer_gets_every_word_in_capitals() -> None:
    habit = fit_recasing(CAPITALS * 3, INPUTS * 3, TITLE * 3)
    assert habit == Recasing("all-upper")
    assert fit_recasing(CAPITALS * 3, INPUTS * 3, NAMED * 3) == Recasing("all-upper")
    assert habit.apply("\u00ab zoo \u00bb: Welcomes nfl\u2019s first baby giraffe", "") == (
        "\u00ab ZOO \u00bb: WELCOMES NFL\u2019S FIRST BABY GIRAFFE"
    )


def test_no_whole_case_habit_when_the_model_already_writes_so_or_the_user_shows_too_little() -> None:
    assert fit_recasing(LOWER * 3, INPUTS * 3, LOWER * 3) is None
    assert fit_recasing(CAPITALS * 3, INPUTS * 3, CAPITALS * 3) is None
    # 3 of 4 of the model's outputs already all lower case: 1.0 against 0.75, past the strong margin
    assert fit_recasing(LOWER * 4, INPUTS * 4, LOWER * 3 + TITLE) == Recasing("all-lower")
    assert fit_recasing(LOWER[:2], INPUTS[:2], TITLE[:2]) is None  # under 20 cased words
    assert fit_recasing(CAPITALS[:2], INPUTS[:2], TITLE[:2]) is None
    # long sentence-case outputs are over 95% lower-case letters, but their first words are capitalised
    long = [sentence_case(t) + " and what it means for the rest of the world this year" for t in TITLE]
    habit = fit_recasing(long * 3, INPUTS * 3, [t + " And What It Means" for t in TITLE] * 3)
    assert habit is not None and habit.mode == "lower"
    # nor is one who capitalises a third of the first words of otherwise lower-case headlines
    mixed = ["Zoo " + t for t in LOWER] + LOWER * 2
    assert fit_recasing(mixed, INPUTS * 3, TITLE * 3) != Recasing("all-lower")


def test_whole_case_habits_stream_word_by_word_and_are_stored_and_described() -> None:
    for mode, expected in (
        ("all-lower", "trump says he will veto the "),
        ("all-upper", "TRUMP SAYS HE WILL VETO THE "),
    ):
        habit = Recasing(mode)
        sent: list[str] = []
        stream = FinishingStream(habit.apply, "", sent.append)
        pieces = ["Trump", " sa", "ys", " He", " Will", " veto", " The", " Bill"]
        for piece in pieces:
            stream(piece)
        assert "".join(sent) == expected  # the last word is still being written
        stream.close()
        assert "".join(sent) == habit.apply("".join(pieces))
        bias = TokenBias(first={5: 1.0}, recasing=habit)
        assert TokenBias.from_json(bias.to_json()).recasing == habit
    lower = " ".join(describe_habits(TokenBias(recasing=Recasing("all-lower")), str))
    assert "everything in lower case" in lower and "sentence case" not in lower
    assert "capitals" in " ".join(describe_habits(TokenBias(recasing=Recasing("all-upper")), str))
    # a recasing stored before these habits reads as before
    stored = {"mode": "lower", "exceptions": ["obama"], "names_from_input": True}
    again = TokenBias.from_json({"recasing": stored}).recasing
    assert again == Recasing("lower", frozenset({"obama"}), names_from_input=True)
    assert again.apply("Obama Visits Zoo") == "Obama visits zoo"


@pytest.mark.parametrize(
    "entry",
    [{"mode": "shout"}, {"mode": "lower", "exceptions": "obama"}, {"mode": "lower", "names_from_input": 1}],
)
def test_a_damaged_entry_names_the_field(entry: dict) -> None:
    with pytest.raises(ValueError, match="recasing field"):
        TokenBias.from_json({"recasing": entry})


def test_names_with_inner_capitals_and_the_pronoun_i_keep_their_spelling() -> None:
    """Sentence case wrote "i'm" and "mcdonald's", Title Case "IPhone" and "EBay" (audit85): a change of the word."""
    lower, upper = Recasing("lower"), Recasing("upper")
    assert lower.apply("Why I Quit And I'm Happy At McDonald's, Says YouTube Star") == (
        "Why I quit and I'm happy at McDonald's, says YouTube star"
    )
    assert lower.apply("Opinion: I’ve Had Enough") == "Opinion: I’ve had enough"
    assert lower.apply("Tesla Unveils Self-Driving E-Bikes") == "Tesla unveils self-driving e-bikes"
    assert upper.apply("apple unveils new iPhone on eBay") == "apple Unveils New iPhone On eBay"
    assert (
        upper.apply("zoo opens as i watch and i'm glad") == "zoo Opens As I Watch And I'm Glad"
    )  # still mended
