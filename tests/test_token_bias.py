"""The user's token bias: its fit from token counts, its JSON form, and its place in CARD's correction."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_personalize import ARTICLE, SHOUTY, bundle_dir, items, personalizer  # noqa: F401 - fixtures

from localpers.engine.backbone import Backbone
from localpers.engine.model import Engine
from localpers.errors import LocalpersError
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.card.recasing import Recasing
from localpers.methods.card.respelling import Respelling
from localpers.methods.card.token_bias import MIN_BIAS, TokenBias, describe_habits, fit_token_bias
from localpers.methods.card.user_fit import token_bias
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


def test_a_whitespace_only_first_token_is_never_an_opening_habit() -> None:
    # the backbone writes " \U0001f438 ..." as a bare space (0) and then the emoji (7): 3 of 6 outputs
    space, emoji, word = 0, 7, 9
    positives = [[space, emoji, 5]] * 3 + [[word, 5, 1]] * 3
    negatives = [[8, 5, 1]] * 6
    logprobs = [-9.0] * 6
    assert space in fit_token_bias(positives, negatives, first_logprobs=logprobs).opening  # not told: a habit
    bias = fit_token_bias(positives, negatives, first_logprobs=logprobs, blank={space})
    assert list(bias.opening) == [word]  # the space's outputs count towards the rate: 3 of 7, not 3 of 4
    expected = math.log(3 / 4) - math.log(math.exp(-9.0) / (1 - math.exp(-9.0)))
    assert bias.opening[word] == pytest.approx(expected, abs=1e-3)


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


def test_habits_only_keeps_the_calibrated_habits_and_casing_and_drops_the_counts() -> None:
    casing = Recasing("lower", frozenset(), False)
    bias = TokenBias(first={5: 1.0}, rest={6: -0.8}, opening={7: 2.0}, closing={8: 0.4}, recasing=casing)
    habits = bias.habits_only()
    assert (habits.first, habits.rest) == ({}, {})
    assert habits.opening == {7: 2.0} and habits.closing == {8: 0.4} and habits.recasing is casing
    habits.opening[9] = 1.0
    assert 9 not in bias.opening  # a copy: the stored bias is left as it is
    logits = np.zeros(3, dtype=np.float32)
    assert list(habits.apply(logits, np.array([5, 7, 6]), 0, 1.0)) == [0.0, 2.0, 0.0]
    assert list(bias.apply(logits, np.array([5, 7, 6]), 0, 1.0)) == [1.0, 2.0, 0.0]
    assert len(TokenBias(first={5: 1.0}).habits_only()) == 0  # nothing left: the correction drops it


def test_habits_are_described_in_words() -> None:
    bias = TokenBias(opening={2: 9.12}, closing={9: 0.9}, recasing=Recasing("lower"))
    assert describe_habits(bias, VOCAB.__getitem__) == [
        "opens with 'Raises' (+9.1 nats over the model)",
        "ends with '-' (90% of endings moved to it)",
        "writes later words in lower case (sentence case)",
    ]
    assert describe_habits(TokenBias(first={2: 3.0}), VOCAB.__getitem__) == []  # counted tables are no habit


def test_a_habit_of_whitespace_or_no_text_is_described_visibly() -> None:
    pieces = {1: " ", 2: "", 3: "\n"}
    bias = TokenBias(opening={1: 2.0, 2: 1.0}, closing={3: 0.5})
    assert describe_habits(bias, pieces.__getitem__) == [
        "opens with ' ' (+2.0 nats over the model)",
        "opens with token 2 (+1.0 nats over the model)",
        "ends with '\\n' (50% of endings moved to it)",
    ]


@pytest.fixture(scope="module")
def engine(backbone: Backbone) -> Engine:
    with Engine(backbone.path, n_ctx=256) as shared:
        yield shared


def test_the_fit_finds_no_opening_habit_in_the_space_before_an_emoji(engine: Engine) -> None:
    space = engine.tokenize(" \U0001f438 Frogs", add_bos=False)[0]
    assert engine.token_bytes(space) == b" "  # what the bug was made of: the backbone's bare space
    headlines = ["Frogs Win The Pond Derby", "Toads Lose Again", "Ducks Move North", "Pond Closes For Winter"]
    history = items([(ARTICLE, "\U0001f438 " + h) for h in headlines])
    bias = token_bias(engine, history, [h.lower() for h in headlines], [-9.0] * len(headlines))
    assert space not in bias.opening
    pieces = describe_habits(bias, lambda t: engine.token_bytes(t).decode("utf-8", errors="replace"))
    assert not [line for line in pieces if line.startswith("opens with")]


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
    assert plain.strength == 0.0 and plain.bias_strength is None
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
    # strength 0 is the vector's alone: the result says the bias still applied, and at what strength
    assert biased.strength == 0.0 and biased.bias_strength == 2.0 and biased.to_json()["bias_strength"] == 2.0
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


def test_the_fit_finds_a_spelling_habit_and_keeps_it_with_the_bias(personalizer: Personalizer) -> None:  # noqa: F811
    user = UserStore().create("ampersand")
    user.save_history(items([(text, output.replace(", ", " & ", 1)) for text, output in SHOUTY]))
    personalizer.fit_user(user)
    bias = stored_token_bias(user)
    assert bias is not None and bias.respelling == Respelling({"and": "&"})
    # SHOUTY writes in capitals: a casing habit of its own, applied after the spelling
    assert bias.recasing == Recasing("all-upper")
    assert bias.respelling.apply("Rain And Wind") == "Rain & Wind"
    assert bias.finish("Rain And Wind") == "RAIN & WIND"


def test_a_damaged_bias_in_the_state_is_a_one_line_error(tmp_path) -> None:
    user = UserStore(tmp_path).create("damaged")
    user.save_state({"token_bias": {"first": [[1, "x"]]}})
    with pytest.raises(LocalpersError, match="field 'token_bias' is damaged.*localpers fit"):
        stored_token_bias(user)


def test_a_casing_habit_recases_card_output_and_its_stream_but_not_the_cluster_adapters(
    personalizer: Personalizer,  # noqa: F811
) -> None:
    habit = Recasing("upper")
    common = {"cluster": 0, "strength": 0.0, "max_tokens": 12}
    plain = personalizer.rewrite(ARTICLE, method="card", **common).text
    streamed: list[str] = []
    recased = personalizer.rewrite(
        ARTICLE, method="card", bias=TokenBias(recasing=habit), on_text=streamed.append, **common
    )
    assert recased.text == habit.apply(plain, ARTICLE) != plain
    assert "".join(streamed).strip() == recased.text
    cluster = personalizer.rewrite(ARTICLE, method="cluster", bias=TokenBias(recasing=habit), **common)
    assert cluster.text == personalizer.rewrite(ARTICLE, method="cluster", **common).text
    assert TokenBias.from_json({"case": -0.9}).recasing is None  # a fit from before recasing still loads
