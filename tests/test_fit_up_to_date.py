"""`localpers fit` with nothing new keeps the stored fit instead of fitting it all again.

Before, a second `fit` on the same history redid the whole fit (about 24 s at 500 items) and only redrew its
sampled y-, so the vector changed for nothing. The stored fit is kept when it was made from the same history and
window, the same bundle and the same version of localpers; any of those changed, or `--refit`, fits again.
"""

from __future__ import annotations

import json

from test_personalize import SHOUTY, bundle_dir, items  # noqa: F401 - fixtures
from typer.testing import CliRunner

import localpers
from localpers.cli import app
from localpers.methods import stored_files
from localpers.users.history import HistoryItem
from localpers.users.store import UserStore


def _fit(common: list[str], *extra: str) -> dict:
    result = CliRunner().invoke(app, ["fit", *common, "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_fit_with_nothing_new_keeps_the_stored_one(bundle_dir, backbone, monkeypatch) -> None:  # noqa: F811
    store = UserStore()
    user = store.create("steady")
    user.save_history(items(SHOUTY))
    common = ["--user", "steady", "--bundle", str(bundle_dir), "--model", str(backbone.path)]
    first = _fit(common)
    assert first["unchanged"] is False
    state = user.state_path.read_bytes()
    again = _fit(common)
    assert again["unchanged"] is True and again["n_pairs"] == first["n_pairs"]
    assert set(again) == set(first)  # the same keys as a fit's (kept_without_history was missing)
    assert user.state_path.read_bytes() == state  # nothing written
    said = CliRunner().invoke(app, ["fit", *common])
    assert said.exit_code == 0 and "already fitted on this history" in said.stderr
    assert f"cluster {first['cluster']}" in said.stdout  # the stored fit's summary

    assert _fit(common, "--refit")["unchanged"] is False
    assert _fit(common, "--history-limit", "5")["unchanged"] is False  # another window
    assert _fit(common, "--history-limit", "5")["unchanged"] is True

    fitted = json.loads(user.state_path.read_text())
    fitted["fitted_by"] = "localpers 0.0.1"  # made by another version
    user.state_path.write_text(json.dumps(fitted))
    assert _fit(common, "--history-limit", "5")["unchanged"] is False
    # a change to fitting bumps the fit format, and the fits made before it are made again, under the same version
    monkeypatch.setattr(stored_files, "FIT_FORMAT", 2)
    assert _fit(common, "--history-limit", "5")["unchanged"] is False
    assert _fit(common, "--history-limit", "5")["unchanged"] is True
    monkeypatch.setattr(stored_files, "FIT_FORMAT", 1)  # format 1's fits marked before formats were named
    fitted = json.loads(user.state_path.read_text())
    fitted["fitted_by"] = f"localpers {localpers.__version__}"
    user.state_path.write_text(json.dumps(fitted))
    assert _fit(common, "--history-limit", "5")["unchanged"] is True

    user.save_history([*user.history(), HistoryItem.create("headline", "A new article.", "NEW HEADLINE!")])
    assert _fit(common, "--history-limit", "5")["unchanged"] is False  # the history changed


def test_a_stored_fit_that_a_rewrite_could_not_use_is_fitted_again(bundle_dir, backbone) -> None:  # noqa: F811
    store = UserStore()
    user = store.create("mended")
    user.save_history(items(SHOUTY))
    common = ["--user", "mended", "--bundle", str(bundle_dir), "--model", str(backbone.path)]
    assert _fit(common)["unchanged"] is False
    good = json.loads(user.state_path.read_text())
    damages = {
        "vector overwritten": lambda: user.vector_path().write_bytes(b"not a vector"),
        "vector deleted": lambda: user.vector_path().unlink(),
        "choice not an object": lambda: user.state_path.write_text(json.dumps({**good, "choice": "x"})),
        "choice without its fields": lambda: user.state_path.write_text(
            json.dumps({**good, "choice": {"label": 3}})
        ),
        "token bias damaged": lambda: user.state_path.write_text(json.dumps({**good, "token_bias": "x"})),
        "cluster out of the bundle": lambda: user.state_path.write_text(json.dumps({**good, "cluster": 99})),
        "a count of the wrong type": lambda: user.state_path.write_text(
            json.dumps({**good, "fit": {**good["fit"], "n_items": "x"}})
        ),
    }
    for damage, make in damages.items():
        make()
        again = _fit(common)  # the fit the damage message asks for mends it
        assert again["unchanged"] is False, damage
        good = json.loads(user.state_path.read_text())
        rewritten = CliRunner().invoke(
            app, ["rewrite", "A storm hit.", *common, "--json", "--max-tokens", "3"]
        )
        assert rewritten.exit_code == 0, (damage, rewritten.output)


def test_a_fit_of_an_earlier_fit_format_is_not_used_until_the_next_fit(
    bundle_dir,  # noqa: F811
    backbone,
    monkeypatch,
) -> None:
    """Rewrites judged a stored fit by its bundle only, so a fit made by an earlier fitting code (the mark said so)
    was applied as if current; now rewrites, `user show`, `profile`, `doctor` and the TUI treat it as they treat a
    fit of another bundle, until `fit` makes it again."""
    from localpers.bundle.format import sha256_of_file
    from localpers.tui.userdata import load_profile

    store = UserStore()
    user = store.create("older")
    user.save_history(items(SHOUTY))
    common = ["--user", "older", "--bundle", str(bundle_dir), "--model", str(backbone.path)]
    assert _fit(common)["unchanged"] is False
    text = "A new bridge opens downtown."
    current = CliRunner().invoke(app, ["rewrite", text, *common, "--json"])
    assert current.exit_code == 0 and json.loads(current.stdout)["method"] == "card"

    monkeypatch.setattr(stored_files, "FIT_FORMAT", 2)  # the fitting code changed since this fit
    rewritten = CliRunner().invoke(app, ["rewrite", text, *common, "--json"])
    assert rewritten.exit_code == 0, rewritten.output
    answer = json.loads(rewritten.stdout)
    assert answer["method"] != "card"  # the fallback (this test bundle shows no history: the global adapter)
    assert "fitted by a localpers of another fit format (1; this one reads format 2)" in answer["notes"][0]
    shown = CliRunner().invoke(app, ["user", "show", "older"])
    assert shown.exit_code == 0 and "refit due" in shown.stdout
    profiled = CliRunner().invoke(app, ["profile", "--user", "older"])
    assert profiled.exit_code == 0 and "made by a localpers of another fit format" in profiled.stdout
    doctor = CliRunner().invoke(app, ["doctor", "--json"])
    assert "older" in json.loads(doctor.stdout)["users"]["fitted_with_another_bundle"]
    assert load_profile(user, sha256_of_file(bundle_dir / "manifest.json")).needs_fit

    assert _fit(common)["unchanged"] is False  # fitted again, in format 2
    again = CliRunner().invoke(app, ["rewrite", text, *common, "--json"])
    assert json.loads(again.stdout)["method"] == "card"


def test_the_fit_format_a_mark_names(monkeypatch) -> None:
    assert stored_files.fit_format_of("localpers 0.1.0") == 1  # marked before formats were named
    assert stored_files.fit_format_of("localpers 0.2.0, fit format 3") == 3
    assert stored_files.fit_format_of(None) is None  # made before marks
    assert stored_files.fit_format_of("localpers 0.1.0, fit format x") is None
    assert stored_files.fit_format_of(7) is None
    assert (
        stored_files.fit_format_of("localpers 0.1.0, fit format \u00b2") is None
    )  # a digit to isdigit, not int
    assert (
        stored_files.fit_format_of("localpers 0.1.0, fit format " + "9" * 5000) is None
    )  # past int()'s limit
    assert stored_files.fit_is_outdated({"fit": {}}) is False  # made before marks: format 1, today's
    monkeypatch.setattr(stored_files, "FIT_FORMAT", 2)
    assert stored_files.fit_is_outdated({"fit": {}}) is True
