"""A user imported without its history keeps the fit it came with, and `fit` prints that fit's report and choice.

A wrongly typed report field or a choice without its words ended `fit` (and `fit --json`) in a traceback, and
`user import` let such an archive in (eighty-ninth session's methods audit, M2): each is now refused in one line
naming state.json and the field, exit 2, by `fit`, `user import` and `user export` alike.
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from localpers.cli import app
from localpers.errors import BAD_INPUT_EXIT_CODE
from localpers.users.archive import pack_archive, read_archive
from localpers.users.history import HistoryItem, history_digest
from localpers.users.store import UserStore

SHA = "0" * 64


def _without(name: str) -> Callable[[dict[str, Any]], None]:
    return lambda choice: choice.pop(name)


# (the field the message names, how the damage is made to state.json)
DAMAGES: dict[str, tuple[str, Callable[[dict[str, Any]], None]]] = {
    "seconds a list": ("fit.seconds", lambda state: state["fit"].update(seconds=[1, 2])),
    "choice without label": ("choice.label", lambda state: _without("label")(state["choice"])),
    "choice without reason": ("choice.reason", lambda state: _without("reason")(state["choice"])),
    "accuracy as text": ("fit.train_accuracy", lambda state: state["fit"].update(train_accuracy="high")),
}


@pytest.fixture
def archive(localpers_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An export without the history of a user fitted with a vector and a choice (a stand-in Personalizer)."""
    from localpers.methods.card import user_fit
    from localpers.methods.card.choice import Choice
    from localpers.methods.stored_files import fit_mark

    host = types.SimpleNamespace(
        bundle_sha256=SHA,
        pairs=types.SimpleNamespace(items_within_context=lambda items: (items, 0)),
        head=types.SimpleNamespace(d=4),
    )
    host.fit_user = lambda user, **kwargs: user_fit.fit_user(host, user, **kwargs)  # type: ignore[attr-defined]
    monkeypatch.setattr("localpers.methods.card.personalizer.Personalizer.open", lambda **_: host)
    fitted = types.SimpleNamespace(
        train_accuracy=0.9,
        heldout_accuracy=0.8,
        heldout_accuracy_default=0.6,
        n_heldout=5,
        regularisation=0.1,
        vector=np.ones(4),
    )
    report = user_fit.fit_report(SHA, "vector", 1, [0.5, 0.9], 24, 20, 4, fitted, {"fit": 1.0})
    user = UserStore().create("source")
    user.save_history([HistoryItem.create("headline", "an article", "A Headline")])
    report.history_sha256 = history_digest(user.history())
    choice = Choice("vector", 0.5, 0.0, {"adapter": -3.0, "vector": -2.9}, 3, "it scored best")
    state = {
        "cluster": 1,
        "bundle_sha256": SHA,
        "fit": report.to_json(),
        "fitted_by": fit_mark(),
        "choice": choice.to_json(),
    }
    user.save_fit(np.ones(4, np.float32), state)
    path = tmp_path / "source.zip"
    assert CliRunner().invoke(app, ["user", "export", "source", "-o", str(path)]).exit_code == 0
    return path


def _assert_one_line_refusal(result: Any, field: str, advice: str) -> None:
    assert result.exit_code == BAD_INPUT_EXIT_CODE, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert f"state.json is damaged: field '{field}'" in lines[0] and advice in lines[0], lines[0]


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_fit_of_a_kept_fit_with_a_damaged_report_or_choice_is_one_line(archive: Path, damage: str) -> None:
    field, make = DAMAGES[damage]
    assert CliRunner().invoke(app, ["user", "import", str(archive), "--as", "kept"]).exit_code == 0
    kept = CliRunner().invoke(app, ["fit", "--user", "kept"])  # sound: kept, and its report and choice shown
    assert kept.exit_code == 0 and "it keeps the fit it came with" in kept.output, kept.output
    assert "chose vector: it scored best" in kept.output
    user = UserStore().get("kept")
    state = json.loads(user.state_path.read_text(encoding="utf-8"))
    make(state)
    user.state_path.write_text(json.dumps(state), encoding="utf-8")
    before = user.state_path.read_bytes()
    for extra in ([], ["--json"]):
        result = CliRunner().invoke(app, ["fit", "--user", "kept", *extra])
        _assert_one_line_refusal(result, field, "`localpers history import FILE --user kept`")
    assert user.state_path.read_bytes() == before  # the imported fit, maybe its only copy, is not thrown away
    exported = CliRunner().invoke(app, ["user", "export", "kept", "-o", str(archive.parent / "again.zip")])
    _assert_one_line_refusal(exported, field, "`localpers fit --user kept`")


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_user_import_refuses_an_archive_whose_kept_fit_is_damaged(archive: Path, damage: str) -> None:
    field, make = DAMAGES[damage]
    manifest, members = read_archive(archive)
    state = json.loads(members["state.json"])
    make(state)
    members["state.json"] = json.dumps(state).encode("utf-8")
    damaged = archive.parent / "damaged.zip"
    damaged.write_bytes(pack_archive(manifest["name"], manifest.get("cluster"), members))
    result = CliRunner().invoke(app, ["user", "import", str(damaged), "--as", "kept"])
    _assert_one_line_refusal(result, field, "export it again on the device it came from")
    assert "kept" not in UserStore().list()
