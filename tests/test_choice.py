"""`localpers fit` chooses the correction per user on their own most recent items (localpers.methods.card.choice)."""

from __future__ import annotations

import json
import math

import pytest
from test_personalize import SHOUTY, bundle_dir, items, personalizer  # noqa: F401 - fixtures
from typer.testing import CliRunner

from localpers.cli import app
from localpers.methods.card import choice as choice_module
from localpers.methods.card.choice import (
    CANDIDATES,
    LARGE_LEAD,
    MIN_ITEMS_TO_CHOOSE,
    MIN_LEAD,
    MIN_STEADINESS,
    candidates_for,
    chosen_bias,
    keeps_correction,
    split_recent,
    steadiness,
    stored_choice,
)
from localpers.methods.card.personalizer import Personalizer
from localpers.methods.card.token_bias import TokenBias
from localpers.users.store import UserStore


def test_the_choice_compares_candidates_on_the_stored_fits_cluster(
    personalizer: Personalizer,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the choice fitted the earlier items alone, assigned to whichever cluster they were closest to: on a cluster
    # bundle its candidates were compared on an adapter the user's rewrites never use (methods audit, s87)
    user = UserStore().create("between")
    history = items(SHOUTY)
    user.save_history(history)
    real = personalizer.assign_cluster

    def closer_to_the_other(outputs: list[str]) -> tuple[int, list[float]]:
        cluster, similarities = real(outputs)
        return (cluster if len(outputs) == len(history) else 1 - cluster), similarities

    monkeypatch.setattr(personalizer, "assign_cluster", closer_to_the_other)
    scored_on: list[object] = []
    real_scoring = personalizer.score_reference_variants

    def scoring(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        scored_on.append(kwargs.get("cluster"))
        return real_scoring(*args, **kwargs)

    monkeypatch.setattr(personalizer, "score_reference_variants", scoring)
    personalizer.fit_user(user)
    stored = user.state()["cluster"]
    assert "choice" in user.state() and scored_on and set(scored_on) == {stored}


def test_split_holds_out_the_most_recent_fifth_between_3_and_10() -> None:
    for n, held in ((8, 3), (20, 4), (40, 8), (100, 10)):
        earlier, recent = split_recent(list(range(n)))
        assert len(recent) == held and recent == list(range(n - held, n)) and earlier == list(range(n - held))


def test_fit_stores_a_choice_made_on_held_out_recent_items(personalizer: Personalizer) -> None:  # noqa: F811
    user = UserStore().create("chooser")
    history = items(SHOUTY)
    assert len(history) >= MIN_ITEMS_TO_CHOOSE
    user.save_history(history)
    report = personalizer.fit_user(user)
    state = user.state()
    chosen = state["choice"]
    assert len(chosen["scores"]) == 8 and set(chosen["scores"]) <= {
        candidate.label for candidate in CANDIDATES
    }
    leader = max(chosen["scores"], key=lambda k: chosen["scores"][k])
    lead = chosen["scores"][leader] - chosen["scores"]["adapter"]
    steady = steadiness(chosen["item_scores"][leader], chosen["item_scores"]["adapter"])
    assert chosen["label"] == (leader if keeps_correction(lead, steady) else "adapter")
    assert chosen["n_items"] == 3 and "most recent items" in chosen["reason"]
    for label, values in chosen["item_scores"].items():  # item by item, for rules read offline
        assert len(values) == 3 and sum(values) / 3 == pytest.approx(chosen["scores"][label], abs=1e-3)
    gaps = [
        mine - alone
        for mine, alone in zip(
            chosen["item_scores"][chosen["label"]], chosen["item_scores"]["adapter"], strict=True
        )
    ]
    assert sum(gap > 1e-3 for gap in gaps) <= chosen["items_higher"] <= sum(gap > -1e-3 for gap in gaps)
    assert report.seconds["choice"] > 0
    strength, bias_strength, label = stored_choice(state)
    expected = {candidate.label: candidate for candidate in CANDIDATES}[label]
    assert bias_strength == expected.bias_strength and chosen["counted"] is expected.counted
    assert strength == pytest.approx(expected.vector_scale * personalizer.head_config.default_strength)
    assert len(user.state_path.read_bytes()) < 10_000


def test_steadiness_is_the_lead_in_standard_errors() -> None:
    assert steadiness([1.0, 2.0, 3.0], [0.0, 0.0, 0.0]) == pytest.approx(2.0 / (1.0 / 3**0.5))
    assert steadiness([0.5, 0.5], [0.0, 0.0]) == float("inf")  # the same lead on every item
    assert steadiness([0.0, 0.0], [0.0, 0.0]) == 0.0 and steadiness([-1.0, -1.0], [0.0, 0.0]) == 0.0
    assert (
        steadiness([0.09, -0.01, -0.01], [0.0] * 3)
        < MIN_STEADINESS
        < steadiness([0.05, 0.04, 0.01], [0.0] * 3)
    )


def test_a_small_lead_must_be_steady_a_large_one_need_not() -> None:
    assert not keeps_correction(0.02, 0.7) and keeps_correction(0.02, MIN_STEADINESS)
    assert keeps_correction(LARGE_LEAD, 0.5) and keeps_correction(0.2, -1.0)
    assert not keeps_correction(MIN_LEAD / 2, math.inf)  # steady, but too small a lead


def test_ties_and_losses_go_to_the_adapter_alone(
    personalizer: Personalizer,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    user = UserStore().create("tied")
    user.save_history(items(SHOUTY))
    monkeypatch.setattr(
        personalizer, "score_reference_variants", lambda text, ref, variants, **k: [-2.0] * len(variants)
    )
    tied = choice_module.choose_correction(
        personalizer, user, items(SHOUTY), regularisation=1.0, prior_weight=0.0
    )
    assert tied is not None and tied.label == "adapter" and tied.vector_strength == tied.bias_strength == 0.0
    assert "nothing beat your cluster adapter" in tied.reason

    def bias_wins(text, reference, variants, **kwargs):  # the likelihood peaks at bias strength 2
        return [-2.0 - 0.1 * abs(v.bias_strength - 2.0) - 0.05 * (v.strength > 0) for v in variants]

    monkeypatch.setattr(personalizer, "score_reference_variants", bias_wins)
    won = choice_module.choose_correction(
        personalizer, user, items(SHOUTY), regularisation=1.0, prior_weight=0.0
    )
    assert won.label == "bias x2" and won.bias_strength == 2.0 and won.vector_strength == 0.0
    assert won.items_higher == 3 and won.reason.endswith("higher on 3 of the 3")
    assert tied.items_higher == 0 and won.to_json()["items_higher"] == 3

    def one_item_carries_it(text, reference, variants, **kwargs):  # +0.3 on one item, -0.01 on the others
        gain = 0.3 if reference == items(SHOUTY)[-1].output else -0.01
        return [-2.0 + (gain if v.bias_strength == 1.0 and v.strength == 0 else 0.0) for v in variants]

    monkeypatch.setattr(personalizer, "score_reference_variants", one_item_carries_it)
    carried = choice_module.choose_correction(
        personalizer, user, items(SHOUTY), regularisation=1.0, prior_weight=0.0
    )
    # a lead of 0.093 (>= LARGE_LEAD) that one item carries: kept, as a habit's large lead seldom is steady
    assert carried.label == "bias" and carried.items_higher == 1 and "higher on 1 of the 3" in carried.reason

    def one_item_carries_a_small_lead(text, reference, variants, **kwargs):  # +0.09 on one item, -0.01 else
        gain = 0.09 if reference == items(SHOUTY)[-1].output else -0.01
        return [-2.0 + (gain if v.bias_strength == 1.0 and v.strength == 0 else 0.0) for v in variants]

    monkeypatch.setattr(personalizer, "score_reference_variants", one_item_carries_a_small_lead)
    uneven = choice_module.choose_correction(
        personalizer, user, items(SHOUTY), regularisation=1.0, prior_weight=0.0
    )
    # a lead of 0.023 that one item carries (0.7 standard errors): the adapter alone, and the reason says why
    assert uneven.label == "adapter" and uneven.scores["bias"] - uneven.scores["adapter"] > MIN_LEAD
    assert "'bias', beat your cluster adapter alone by 0.0233 log p/token but unevenly" in uneven.reason
    assert "higher on 1 of the 3" in uneven.reason and "0.7 standard errors" in uneven.reason

    def two_items_carry_it(text, reference, variants, **kwargs):  # +0.05, +0.04 and +0.01: steady enough
        gain = {items(SHOUTY)[-1].output: 0.05, items(SHOUTY)[-2].output: 0.04}.get(reference, 0.01)
        return [-2.0 + (gain if v.bias_strength == 1.0 and v.strength == 0 else 0.0) for v in variants]

    monkeypatch.setattr(personalizer, "score_reference_variants", two_items_carry_it)
    steady = choice_module.choose_correction(
        personalizer, user, items(SHOUTY), regularisation=1.0, prior_weight=0.0
    )
    assert steady.label == "bias" and steady.items_higher == 3 and "higher on 3 of the 3" in steady.reason

    def narrow_lead(text, reference, variants, **kwargs):  # 'vector' ahead by 0.005 on every item
        return [-2.0 + (0.005 if v.strength > 0 and v.bias_strength == 0 else 0.0) for v in variants]

    monkeypatch.setattr(personalizer, "score_reference_variants", narrow_lead)
    narrow = choice_module.choose_correction(
        personalizer, user, items(SHOUTY), regularisation=1.0, prior_weight=0.0
    )
    assert narrow.label == "adapter" and narrow.vector_strength == narrow.bias_strength == 0.0
    assert narrow.items_higher == 0 and narrow.scores["vector"] > narrow.scores["adapter"]
    assert "'vector', beat your cluster adapter alone by only 0.0050" in narrow.reason
    assert "higher on 3 of the 3" in narrow.reason and f"needs {MIN_LEAD}" in narrow.reason
    assert (
        choice_module.choose_correction(
            personalizer, user, items(SHOUTY[:5]), regularisation=1.0, prior_weight=0.0
        )
        is None
    )


def test_habits_candidates_score_the_bias_without_its_counted_tables(
    personalizer: Personalizer,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    user = UserStore().create("habitual")
    user.save_history(items(SHOUTY))
    seen: list[list] = []

    def habits_win(text, reference, variants, **kwargs):
        seen.append(list(variants))
        return [
            -2.0 if v.bias is not None and not v.bias.first and not v.bias.rest else -2.5 for v in variants
        ]

    outcome = personalizer.fit_items(user, items(SHOUTY)[:-3], regularisation=1.0, prior_weight=0.0)
    monkeypatch.setattr(personalizer, "fit_items", lambda *a, **k: outcome)
    outcome.bias.opening = {7: 1.5}  # a habit to keep (SHOUTY's fitted bias may have none)
    outcome.bias.first = outcome.bias.first or {8: 1.0}  # and a counted table to leave out
    monkeypatch.setattr(personalizer, "score_reference_variants", habits_win)
    won = choice_module.choose_correction(
        personalizer, user, items(SHOUTY), regularisation=1.0, prior_weight=0.0
    )
    assert won is not None and won.label == "habits" and not won.counted and won.bias_strength == 1.0
    labels = [candidate.label for candidate in candidates_for(outcome.bias)]
    assert "bias x0.1" not in labels and "habits" in labels  # a user with a habit: habits, not x0.1
    assert "habits" not in [c.label for c in candidates_for(TokenBias(first={8: 1.0}))]
    habits = seen[0][labels.index("habits")].bias
    assert habits.opening == {7: 1.5} and not habits.first and not habits.rest
    assert seen[0][labels.index("bias")].bias.first  # the counted candidates keep their tables
    state = {"choice": won.to_json()}
    assert state["choice"]["counted"] is False
    assert chosen_bias(state, outcome.bias).first == {} and chosen_bias(state, outcome.bias).opening == {
        7: 1.5
    }
    assert chosen_bias({"choice": {"label": "bias", "counted": True}}, outcome.bias) is outcome.bias
    assert chosen_bias({}, outcome.bias) is outcome.bias  # fits made before this candidate existed


def test_cli_fit_says_what_it_chose_and_rewrite_applies_it(bundle_dir, backbone) -> None:  # noqa: F811
    runner = CliRunner()
    store = UserStore()
    store.create("cli-chooser").save_history(items(SHOUTY))
    common = ["--user", "cli-chooser", "--bundle", str(bundle_dir), "--model", str(backbone.path)]
    result = runner.invoke(app, ["fit", *common, "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["choice"]["label"] in {candidate.label for candidate in CANDIDATES}
    result = runner.invoke(app, ["fit", *common])
    assert result.exit_code == 0 and "chose " in result.output
    result = runner.invoke(
        app, ["rewrite", "The zoo got a new tiger.", *common, "--json", "--max-tokens", "4"]
    )
    assert result.exit_code == 0, result.output
    strength, _, _ = stored_choice(store.get("cli-chooser").state())
    assert json.loads(result.output)["strength"] == pytest.approx(strength)
