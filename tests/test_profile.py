"""`localpers profile`: CARD's fit, the habits it found, and the series a user repeats, without EXACT's index."""

from __future__ import annotations

import json

from read_counting import count_history_reads
from typer.testing import CliRunner

from localpers.cli import app
from localpers.users.history import HistoryItem
from localpers.users.store import UserStore

SERIES = [(f"Cat tweets of week {n}.", f"{n} Funniest Cat Tweets This Week") for n in range(10, 14)]
OTHERS = [
    ("The council approved bike lanes.", "Bike Lanes Win"),
    ("A storm closed the road.", "Storm Shuts Road"),
]


def make_user(name: str) -> None:
    items = [HistoryItem.create("headline", i, o) for i, o in SERIES[:2] + OTHERS + SERIES[2:]]
    UserStore().create(name).save_history(items)


def test_profile_lists_the_series_before_any_fit() -> None:
    make_user("seriesy")
    shown = CliRunner().invoke(app, ["profile", "--user", "seriesy", "--json"])
    assert shown.exit_code == 0, shown.output
    profile = json.loads(shown.stdout)
    assert profile["card"] is None and profile["exact"] is None
    (series,) = profile["series"]
    assert series["size"] == 4 and series["task"] == "headline"
    assert series["latest"] == "13 Funniest Cat Tweets This Week"
    history = UserStore().get("seriesy").history()
    assert series["ids"] == [item.id for item in history if "Cat Tweets" in item.output]
    text = CliRunner().invoke(app, ["profile", "--user", "seriesy"])
    assert text.exit_code == 0 and "4 alike (headline), the latest: 13 Funniest Cat Tweets" in text.stdout
    # the advice names the user asked about: a bare `localpers fit` fits the active user
    assert "CARD: not fitted (run `localpers fit --user seriesy`)" in text.stdout
    assert "EXACT: no index (run `localpers fit --method exact --user seriesy`)" in text.stdout


def test_profile_shows_the_fits_choice_and_habits() -> None:
    make_user("fitted")
    user = UserStore().get("fitted")
    state = user.state()
    state["cluster"] = 1
    state["fit"] = {"mode": "vector", "cluster_similarities": [0.1, 0.3], "habits": ["opens with 'Cat'"]}
    state["choice"] = {"label": "vector", "reason": "it beat [the adapter] alone"}
    user.save_state(state)
    shown = CliRunner().invoke(app, ["profile", "--user", "fitted"])
    assert shown.exit_code == 0, shown.output
    assert "correction: vector: it beat [the adapter] alone" in shown.stdout  # reasons are not markup
    assert "habits: opens with 'Cat'" in shown.stdout
    profile = json.loads(CliRunner().invoke(app, ["profile", "--user", "fitted", "--json"]).stdout)
    assert profile["card"]["choice"]["label"] == "vector" and profile["card"]["habits"] == [
        "opens with 'Cat'"
    ]


def test_profile_shows_habits_edited_by_hand() -> None:
    """A number among the habits ended `profile` in a traceback, and one habit alone was spelled out letter by
    letter ("T; i; t; l; e")."""
    make_user("edited")
    user = UserStore().get("edited")
    for habits, shown in (
        (["opens with 'Cat'", 7], "habits: opens with 'Cat'; 7"),
        ("Title Case", "habits: Title Case"),
    ):
        user.save_state({"cluster": 1, "fit": {"mode": "vector", "habits": habits}})
        result = CliRunner().invoke(app, ["profile", "--user", "edited"])
        assert result.exit_code == 0, result.output
        assert shown in result.stdout


def test_profile_shows_an_imported_fit_report_literally() -> None:
    """The CARD line took a state.json's mode or cluster as rich markup ('[/i]': a traceback), and indented lines
    sent its control characters to the terminal."""
    make_user("imported")
    user = UserStore().get("imported")
    user.save_state({"cluster": "[/b]", "fit": {"mode": "[/i]", "habits": ["opens\x1b[2J"]}})
    result = CliRunner().invoke(app, ["profile", "--user", "imported"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "CARD: cluster [/b] ([/i]), similarities None" in result.stdout
    assert "habits: opens\\x1b[2J" in result.stdout and "\x1b" not in result.stdout


def test_profile_says_when_the_fit_was_made_with_another_bundle() -> None:
    """After an upgrade or a pull the fit is not used (rewrite falls back), but profile showed it as current."""
    from localpers.bundle.format import default_bundle_dir, sha256_of_file

    make_user("moved")
    user = UserStore().get("moved")
    state = user.state()
    state.update(cluster=1, bundle_sha256="ab" * 32, fit={"mode": "vector", "cluster_similarities": [0.1]})
    user.save_state(state)
    shown = CliRunner().invoke(app, ["profile", "--user", "moved"], terminal_width=1000)
    assert "made with another bundle than the one in use" in " ".join(shown.stdout.split())
    assert (
        json.loads(CliRunner().invoke(app, ["profile", "--user", "moved", "--json"]).stdout)["card"][
            "bundle_in_use"
        ]
        is False
    )
    state["bundle_sha256"] = sha256_of_file(default_bundle_dir() / "manifest.json")
    user.save_state(state)
    assert "another bundle" not in CliRunner().invoke(app, ["profile", "--user", "moved"]).stdout


def test_profile_of_a_cold_start_fit_says_to_refit_once_there_is_history() -> None:
    user = UserStore().create("early")
    user.save_state({"cluster": None, "fit": {"mode": "cold-start", "cluster_similarities": []}})
    shown = CliRunner().invoke(app, ["profile", "--user", "early"])
    assert shown.exit_code == 0, shown.output
    assert "cold start" in shown.stdout and "localpers fit --user early" in shown.stdout
    assert "cluster None" not in shown.stdout


def test_a_long_reason_wraps_under_its_own_indent(monkeypatch) -> None:
    make_user("wordy")
    user = UserStore().get("wordy")
    state = user.state()
    state["cluster"] = 1
    state["fit"] = {"mode": "vector", "cluster_similarities": [0.1, 0.3]}
    state["choice"] = {"label": "vector", "reason": " ".join(["because"] * 40)}
    user.save_state(state)
    monkeypatch.setenv("COLUMNS", "60")
    shown = CliRunner().invoke(app, ["profile", "--user", "wordy"])
    lines = shown.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  correction: vector: because"))
    wrapped = lines[start : start + 5]
    assert all(line.startswith("  ") and len(line) <= 60 and line == line.rstrip() for line in wrapped)


def test_profile_of_a_user_with_nothing_fitted_says_what_makes_one() -> None:
    """It failed (exit 1, "no profile yet") for a user without a series but showed one for a user with one, so
    a CJK user whose series went unseen got the error and one with a false series a profile (text audit)."""
    UserStore().create("newcomer").save_history([HistoryItem.create("headline", "A storm.", "Storm Due")])
    shown = CliRunner().invoke(app, ["profile", "--user", "newcomer"])
    assert shown.exit_code == 0, shown.output
    assert "CARD: not fitted (run `localpers fit --user newcomer`)" in shown.stdout
    assert "Series you repeat: none" in shown.stdout and "EXACT: no index" in shown.stdout
    profile = json.loads(CliRunner().invoke(app, ["profile", "--user", "newcomer", "--json"]).stdout)
    assert profile["card"] is None and profile["exact"] is None and profile["series"] == []


def test_a_damaged_exact_index_is_named_and_the_rest_of_the_profile_shown() -> None:
    # one damaged exact-index.safetensors made the whole profile exit 2, where `user show` reported the rest
    from localpers.methods.exact_index import index_path

    make_user("ann")
    index_path(UserStore().get("ann")).write_bytes(b"not a safetensors file")
    result = CliRunner().invoke(app, ["profile", "--user", "ann", "--json"])
    assert result.exit_code == 0, result.output
    profile = json.loads(result.stdout)
    assert "exact-index.safetensors" in profile["exact"]["damaged"] and profile["series"]
    shown = CliRunner().invoke(app, ["profile", "--user", "ann", "--text", "A new article."])
    assert shown.exit_code == 0, shown.output
    assert "EXACT: " in shown.stdout and "exact-index.safetensors" in shown.stdout
    assert "for this text: no attributes (EXACT's index is damaged)" in shown.stdout


def test_a_fit_whose_vector_is_gone_or_cut_is_named_damaged_as_a_rewrite_refuses_it() -> None:
    """With the vector state.json names deleted or truncated, profile showed the fit as current (exit 0) while
    every rewrite refused the user (audit88): CARD's part is now its `damaged` note, as EXACT's is."""
    import numpy as np
    import pytest

    from localpers.errors import LocalpersError

    make_user("ann")
    user = UserStore().get("ann")
    user.save_fit(
        np.ones(8, np.float32), {"cluster": 1, "fit": {"mode": "vector", "cluster_similarities": [0.2]}}
    )
    vector = user.vector_path()
    assert vector is not None
    for damage in (vector.unlink, lambda: vector.write_bytes(b"cut")):
        damage()
        with pytest.raises(LocalpersError) as refused:  # what a rewrite reads (`user_profile`)
            user.fit_files()
        result = CliRunner().invoke(app, ["profile", "--user", "ann", "--json"])
        assert result.exit_code == 0, result.output
        profile = json.loads(result.stdout)
        assert profile["card"] == {"damaged": str(refused.value)} and profile["series"]
        assert "localpers fit --user ann" in profile["card"]["damaged"]
        shown = CliRunner().invoke(app, ["profile", "--user", "ann"], terminal_width=1000)
        assert shown.exit_code == 0, shown.output
        assert f"CARD: {refused.value}" in shown.stdout and "cluster 1" not in shown.stdout


def test_profile_reads_the_history_once_and_reports_its_size(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The text profile read and parsed the history for its series, then again to know whether there was one
    (for the advice to import first); `--json` now says how many items the profile was made from."""
    make_user("counted")
    reads = count_history_reads(monkeypatch)
    shown = CliRunner().invoke(app, ["profile", "--user", "counted"])
    assert shown.exit_code == 0, shown.output
    assert reads == ["counted"]
    profile = json.loads(CliRunner().invoke(app, ["profile", "--user", "counted", "--json"]).stdout)
    assert profile["history_items"] == len(SERIES) + len(OTHERS)
