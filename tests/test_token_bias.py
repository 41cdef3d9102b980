"""The user's token bias: its fit from token counts, its JSON form, and its place in CARD's correction."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_personalize import ARTICLE, SHOUTY, bundle_dir, items, personalizer  # noqa: F401 - fixtures

from localpers.errors import LocalpersError
from localpers.methods.card.casing import TokenCasing, word_case
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.card.token_bias import MIN_BIAS, TokenBias, describe_habits, fit_token_bias
from localpers.methods.card.user_state import stored_token_bias
from localpers.users.store import UserStore


def test_bias_favours_what_the_user_writes_and_the_model_does_not() -> None:
    # token 7 opens every user output, never the model's; 9 is the model's habit; 5 is shared
    positives = [[7, 5, 1], [7, 5, 2], [7, 5, 3], [7, 5, 4]]
    negatives = [[9, 5, 1], [9, 5, 2], [9, 5, 3], [9, 5, 4]]
    bias = fit_token_bias(positives, negatives)
    assert bias.first[7] > 1.0 and bias.first[9] < -1.0
    assert 5 not in bias.rest and 1 not in bias.rest  # same rate on both sides: no habit
    assert all(abs(b) >= MIN_BIAS for b in (*bias.first.values(), *bias.rest.values()))
    expected = math.log((4 + 1) / (4 + 2)) - math.log((0 + 1) / (4 + 2))
    assert bias.first[7] == pytest.approx(expected)
    assert fit_token_bias([], []) == TokenBias()


def test_json_round_trip_and_damaged_entries() -> None:
    bias = TokenBias({7: 1.6094}, {11: -0.75, 3: 0.9})
    assert TokenBias.from_json(bias.to_json()) == TokenBias({7: 1.609}, {11: -0.75, 3: 0.9})
    for bad in (
        {"first": [[1, float("nan")]]},
        {"rest": [["1", 0.5]]},
        {"first": "x"},
        [],
        {"rest": [[-1, 1]]},
    ):
        with pytest.raises(ValueError, match="token bias"):
            TokenBias.from_json(bad)


def test_opening_habit_is_calibrated_against_the_models_probability() -> None:
    # the user opens 5 of 6 outputs with token 7, which the model gives e^-9 there; 8 opens one output only
    positives = [[7, 5, 1], [7, 5, 2], [7, 5, 3], [7, 5, 4], [7, 6, 2], [8, 5, 1]]
    negatives = [[8, 5, 1]] * 6
    logprobs = [-9.0, -9.0, -9.0, -9.0, None, -1.0]
    bias = fit_token_bias(positives, negatives, first_logprobs=logprobs)
    expected = math.log(5 / 2) - math.log(math.exp(-9.0) / (1 - math.exp(-9.0)))  # logit(5/7) - logit(e^-9)
    assert bias.opening == {7: pytest.approx(expected, abs=1e-3)}  # 8 is a one-off: no habit
    assert 7 not in bias.first  # the calibrated push replaces the counted one
    # added once, whatever the strength of the counted tables: the first step lifts 7 to about 5/7 of the mass
    logits = [0.0] * 9 + [9.0]  # log p(7) = -9
    added = bias.apply(np.array(logits), np.arange(10), 0, 1.0)
    final = np.array(logits) + added
    share = np.exp(final[7] - np.logaddexp.reduce(final))
    assert share == pytest.approx(5 / 7, abs=0.01)
    assert not bias.apply(np.array(logits), np.arange(10), 1, 1.0)[7]  # the first step only
    assert 7 in bias.habitual_tokens(0).tolist()
    assert fit_token_bias(positives, negatives).opening == {}  # without the model's log-probabilities


def test_closing_habit_moves_the_ending_to_the_habit_once() -> None:
    question, newline, word = 42, 10, 3
    positives = [[5, 6, question]] * 9 + [[5, 6, word]]
    negatives = [[5, 6, word]] * 10
    assert fit_token_bias(positives, negatives).closing == {}  # a closing habit must be allowed (punctuation)
    bias = fit_token_bias(positives, negatives, closing_allowed={question})
    share = bias.closing[question]
    assert share == pytest.approx((9 / 11 - 1 / 12) / (1 - 1 / 12), abs=1e-3)
    assert question not in bias.rest  # pushed anywhere, a closing "?" lands mid-output
    ids = np.array([3, newline, question, 7])
    logits = np.array([1.0, 2.0, -6.0, 0.5], dtype=np.float32)
    moved = logits.copy()
    bias.apply_closing(moved, ids, np.array([newline]), step=3, last=7)
    probabilities = np.exp(moved - np.logaddexp.reduce(moved))
    before = np.exp(logits - np.logaddexp.reduce(logits))
    assert probabilities[2] == pytest.approx(before[2] + share * before[1], rel=1e-4)
    assert probabilities[1] == pytest.approx((1 - share) * before[1], rel=1e-4)
    assert moved[0] == logits[0] and moved[3] == logits[3]  # other tokens keep their logits
    for step, last in ((0, None), (3, question)):  # not at the first step; not after the habit
        same = logits.copy()
        bias.apply_closing(same, ids, np.array([newline]), step=step, last=last)
        assert np.array_equal(same, logits)
    with pytest.raises(ValueError, match="closing share"):
        TokenBias.from_json({"closing": [[42, 1.5]]})
    assert TokenBias.from_json(bias.to_json()).closing == bias.closing


VOCAB = {
    1: "Fed",
    2: " Raises",
    3: " rais",
    4: " Rates",
    5: " rates",
    6: " FBI",
    7: "ing",
    8: " Trump",
    9: "-",
    10: "Backed",
    11: "backed",
    12: "es",
}


def fake_casing() -> TokenCasing:
    ids = {piece: token for token, piece in VOCAB.items()}

    def tokenize(text: str) -> list[int]:  # " raises" -> [" rais", "es"]: the twin is the first token
        return [3, 12] if text == " raises" else [ids[text]] if text in ids else []

    return TokenCasing(VOCAB.__getitem__, tokenize)


def test_word_case_and_twins() -> None:
    assert [word_case(VOCAB[t]) for t in (1, 2, 3, 6, 7, 10)] == [0, 1, -1, 0, 0, 0]  # no space, acronym: 0
    assert word_case("Backed", "-") == 1 and word_case("backed", " '") == -1  # a word after "-" or a quote
    casing = fake_casing()
    assert casing.twin(2) == 3 and casing.twin(5) == 4 and casing.twin(10) == 11
    assert casing.case_of(10, 9) == 1 and casing.case_of(10, 8) == 0  # "Backed" starts a word after "-" only
    assert casing.twin(6) is None and casing.twin(9) is None  # acronyms and punctuation have none


def test_casing_habit_moves_capitalised_word_starts_to_lower_case() -> None:
    casing = fake_casing()
    positives = [[1, 3, 12, 5]] * 6  # "Fed raises rates": sentence case
    negatives = [[1, 2, 4]] * 6  # the model's Title Case
    bias = fit_token_bias(positives, negatives, casing=casing)
    assert bias.case == pytest.approx(-(1 - (1 / 14) / (13 / 14)), abs=1e-3)  # add-one smoothed rates
    assert fit_token_bias(positives[:4], negatives[:4], casing=casing).case == 0.0  # 8 word starts: too few
    assert TokenBias.from_json(bias.to_json()).case == bias.case
    candidates = np.array([2, 4, 6, 7])
    assert sorted(bias.case_twins(candidates, 1, casing, last=1)) == [3, 5]  # " Raises", " Rates" bring twins
    assert bias.case_twins(candidates, 0, casing, last=None) == []  # the first word keeps its capital
    ids = np.array([2, 3, 4, 6])
    logits = np.array([3.0, -4.0, 1.0, 2.0], dtype=np.float32)
    moved = logits.copy()
    bias.apply_case(moved, ids, 1, casing, last=1)
    share = abs(bias.case)
    assert np.exp(moved[1]) == pytest.approx(np.exp(-4.0) + share * np.exp(3.0), rel=1e-4)  # " Raises" -> " rais"
    assert moved[0] == pytest.approx(3.0 + math.log(1 - share), abs=1e-5)
    assert moved[2] == logits[2]  # " Rates" has no twin among the candidates: unchanged
    assert moved[3] == logits[3]  # an acronym keeps its case
    assert np.logaddexp.reduce(moved) == pytest.approx(np.logaddexp.reduce(logits), abs=1e-4)  # mass kept
    same = logits.copy()
    bias.apply_case(same, ids, 0, casing, last=None)
    assert np.array_equal(same, logits)
    with pytest.raises(ValueError, match="case"):
        TokenBias.from_json({"case": 2.0})


def test_habits_are_described_in_words() -> None:
    bias = TokenBias(opening={2: 9.12}, closing={9: 0.9}, case=-0.97)
    assert describe_habits(bias, VOCAB.__getitem__) == [
        "opens with 'Raises' (+9.1 nats over the model)",
        "ends with '-' (90% of endings moved to it)",
        "writes later words in lower case (97% of capitalised word starts moved)",
    ]
    assert describe_habits(TokenBias(first={2: 3.0}), VOCAB.__getitem__) == []  # counted tables are no habit


def test_fit_stores_the_bias_and_card_adds_it_to_the_top_k_only(personalizer: Personalizer) -> None:  # noqa: F811
    user = UserStore().create("biased")
    user.save_history(items(SHOUTY))
    report = personalizer.fit_user(user)
    assert report.mode == "vector"
    bias = stored_token_bias(user)
    assert bias is not None and len(bias) > 0
    assert len(user.state_path.read_bytes()) < 10_000  # per-user state stays small
    cluster = user.state()["cluster"]
    plain = personalizer.rewrite(
        ARTICLE,
        method="card",
        cluster=cluster,
        vector=user.vector(),
        strength=0.0,
        record_steps=True,
        max_tokens=6,
    )
    assert all(
        c.after == c.before for step in plain.steps for c in step.candidates
    )  # no bias given: unchanged
    biased = personalizer.rewrite(
        ARTICLE,
        method="card",
        cluster=cluster,
        vector=user.vector(),
        strength=0.0,
        bias=bias,
        bias_strength=2.0,
        record_steps=True,
        max_tokens=6,
    )
    for index, step in enumerate(biased.steps):
        table = bias.for_step(index)
        for candidate in step.candidates:
            assert candidate.after - candidate.before == pytest.approx(
                2.0 * table.get(candidate.token, 0.0), abs=1e-4
            )
    assert any(c.after != c.before for step in biased.steps for c in step.candidates)
    first_candidates = {c.token for c in biased.steps[0].candidates}
    assert set(bias.habitual_tokens(0).tolist()) <= first_candidates  # the user's habits join the top k
    assert len(first_candidates) >= personalizer.head_config.top_k


def test_a_damaged_bias_in_the_state_is_a_one_line_error(tmp_path) -> None:
    user = UserStore(tmp_path).create("damaged")
    user.save_state({"token_bias": {"first": [[1, "x"]]}})
    with pytest.raises(LocalpersError, match="field 'token_bias' is damaged.*localpers fit"):
        stored_token_bias(user)
