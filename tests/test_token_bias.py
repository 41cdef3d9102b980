"""The user's token bias: its fit from token counts, its JSON form, and its place in CARD's correction."""

from __future__ import annotations

import math

import pytest
from test_personalize import ARTICLE, SHOUTY, bundle_dir, items, personalizer  # noqa: F401 - fixtures

from localpers.errors import LocalpersError
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.card.token_bias import MIN_BIAS, TokenBias, fit_token_bias
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
