"""One rule for the exit code of a damaged user file, whichever check catches it.

A file whose content is malformed (bytes that do not parse, a field of the wrong type, a checksum that no
longer matches) exits 2, as a malformed file from outside does; a file localpers keeps that is missing, cannot
be opened or is not a file exits 1 (a state problem). Before, a damaged vector exited 1 but one of the wrong
width 2, and an unreadable state.json 1 but an unreadable stored history 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save
from typer.testing import CliRunner

from localpers.cli import app
from localpers.errors import BAD_INPUT_EXIT_CODE, LocalpersError
from localpers.users.history import HistoryItem
from localpers.users.store import User, UserStore

MALFORMED, UNUSABLE = BAD_INPUT_EXIT_CODE, 1


def fitted_user() -> User:
    user = UserStore().create("ann")
    user.save_fit(np.zeros(8, np.float32), {"cluster": 0})
    return user


def replace_vector(user: User, data: bytes, *, keep_sha: bool) -> None:
    """Write `data` as the vector file; with `keep_sha` state.json is updated to match it."""
    import hashlib

    path = user.vector_path()
    assert path is not None
    path.write_bytes(data)
    if keep_sha:
        state = json.loads(user.state_path.read_text())
        state["vector_sha256"] = hashlib.sha256(data).hexdigest()
        user.state_path.write_text(json.dumps(state))


@pytest.mark.parametrize(
    ("data", "keep_sha"),
    [
        (b"not a safetensors file", True),
        (save({"other": np.zeros(8, np.float32)}), True),
        (save({"lambda": np.zeros(8, np.float64)}), True),
        (save({"lambda": np.full(8, np.inf, np.float32)}), True),
        (save({"lambda": np.zeros(6, np.float32)}), True),
        (save({"lambda": np.ones(8, np.float32)}), False),
    ],
    ids=["garbage", "no-tensor", "float64", "non-finite", "wrong-width", "sha-mismatch"],
)
def test_every_damaged_vector_exits_2(data: bytes, keep_sha: bool) -> None:
    user = fitted_user()
    replace_vector(user, data, keep_sha=keep_sha)
    with pytest.raises(LocalpersError) as exc:
        user.vector()
    assert exc.value.exit_code == MALFORMED, str(exc.value)


def test_a_missing_vector_exits_1() -> None:
    user = fitted_user()
    path = user.vector_path()
    assert path is not None
    path.unlink()
    with pytest.raises(LocalpersError) as exc:
        user.vector()
    assert exc.value.exit_code == UNUSABLE


@pytest.mark.parametrize(
    "field", [{"vector_file": "../elsewhere"}, {"cluster": "one"}, {"token_bias": {"first": 1}}]
)
def test_a_damaged_field_of_state_json_exits_2(field: dict[str, object]) -> None:
    from localpers.methods.card.user_state import stored_token_bias, user_profile

    user = fitted_user()
    state = json.loads(user.state_path.read_text())
    state.update(field)
    user.state_path.write_text(json.dumps(state))
    with pytest.raises(LocalpersError) as exc:
        user_profile(user)
        stored_token_bias(user)
    assert exc.value.exit_code == MALFORMED, str(exc.value)


def test_a_stored_history_that_is_not_a_file_exits_1_and_one_that_does_not_parse_2() -> None:
    user = UserStore().create("ann")
    user.save_history([HistoryItem.create("headline", "An article.", "A headline")])
    user.history_path.unlink()
    user.history_path.mkdir()
    listed = CliRunner().invoke(app, ["history", "list"])
    assert listed.exit_code == UNUSABLE, listed.output
    assert "history.jsonl is a directory" in listed.stderr and "Traceback" not in listed.output

    user.history_path.rmdir()
    user.history_path.write_text("{not json\n", encoding="utf-8")
    listed = CliRunner().invoke(app, ["history", "list"])
    assert listed.exit_code == MALFORMED, listed.output
    assert "history.jsonl line 1" in listed.stderr


def test_a_history_file_to_import_that_is_a_folder_is_still_a_bad_argument(tmp_path: Path) -> None:
    UserStore().create("ann")
    result = CliRunner().invoke(app, ["history", "import", str(tmp_path)])
    assert result.exit_code == MALFORMED, result.output
    assert "is a directory; pass a history file" in result.stderr


@pytest.mark.parametrize("text", ["{not json", json.dumps({"rank": 8})])
def test_a_damaged_cope_state_exits_2(text: str) -> None:
    from localpers.methods.cope import load_state
    from localpers.methods.stored_files import COPE_STATE_FILE

    user = UserStore().create("ann")
    (user.dir / COPE_STATE_FILE).write_text(text)
    with pytest.raises(LocalpersError) as exc:
        load_state(user)
    assert exc.value.exit_code == MALFORMED, str(exc.value)


def test_a_damaged_exact_index_exits_2() -> None:
    from localpers.methods.exact_index import ExactIndex

    user = UserStore().create("ann")
    path = user.dir / "exact.safetensors"
    path.write_bytes(b"garbage")
    with pytest.raises(LocalpersError) as exc:
        ExactIndex.load(path, user.name)
    assert exc.value.exit_code == MALFORMED, str(exc.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("vector_strength", "nan"),
        ("vector_strength", "abc"),
        ("vector_strength", 1e300),
        ("bias_strength", -50),
        ("bias_strength", True),
        ("label", 3),
    ],
)
def test_a_damaged_stored_choice_is_refused_naming_the_field_and_the_user(field: str, value: object) -> None:
    """A damaged strength decoded garbage (a "nan" string read by float()) or fell back silently, exit 0."""
    from localpers.methods.card.choice import stored_choice

    user = fitted_user()
    choice = {"label": "bias", "vector_strength": 0.0, "bias_strength": 1.0, "counted": True, field: value}
    with pytest.raises(LocalpersError) as exc:
        stored_choice({"choice": choice}, str(user.state_path), user.refit_advice)
    assert exc.value.exit_code == MALFORMED
    assert f"field 'choice.{field}'" in str(exc.value) and "localpers fit --user ann" in str(exc.value)


def test_a_stored_choice_that_is_whole_or_older_reads_as_before() -> None:
    from localpers.methods.card.choice import stored_choice

    choice = {"label": "vector+bias", "vector_strength": 0.066257, "bias_strength": 1, "counted": True}
    assert stored_choice({"choice": choice}) == (0.066257, 1.0, "vector+bias")
    assert stored_choice({}) == (None, None, None)
    assert stored_choice({"choice": {"label": "adapter"}}) == (
        None,
        None,
        None,
    )  # before it held the strengths


def test_every_refit_advice_for_a_users_own_file_names_the_user() -> None:
    user = fitted_user()
    path = user.vector_path()
    assert path is not None
    path.unlink()
    with pytest.raises(LocalpersError, match=r"run `localpers fit --user ann` again"):
        user.vector()


def test_a_cluster_the_bundle_does_not_have_exits_2() -> None:
    from types import SimpleNamespace

    from localpers.methods.card.method import profile_for_rewrite

    user = fitted_user()
    state = json.loads(user.state_path.read_text())
    state.update(cluster=7, fit={"mode": "vector"}, bundle_sha256="b" * 64)
    user.state_path.write_text(json.dumps(state))
    bundle = SimpleNamespace(
        bundle_sha256="b" * 64, bundle=SimpleNamespace(k=3), head_config=SimpleNamespace(d=8)
    )
    with pytest.raises(LocalpersError, match="field 'cluster' is 7, but the bundle has 3 clusters") as exc:
        profile_for_rewrite(user, "card", bundle, None)  # type: ignore[arg-type]
    assert exc.value.exit_code == MALFORMED


def test_a_token_bias_too_large_for_float32_is_damaged() -> None:
    from localpers.methods.card.user_state import stored_token_bias

    user = fitted_user()
    state = json.loads(user.state_path.read_text())
    state["token_bias"] = {"first": [[562, 1e300]], "rest": []}
    user.state_path.write_text(json.dumps(state))
    with pytest.raises(LocalpersError, match="field 'token_bias' is damaged") as exc:
        stored_token_bias(user)
    assert exc.value.exit_code == MALFORMED


def test_a_vector_of_another_width_than_the_head_is_damaged_for_rewrite_and_doctor() -> None:
    """A vector whose sha256 and vector_dim were made to match, 8 values for a head of 16: every rewrite ended
    in a numpy broadcast traceback and `doctor` passed the user (audit85)."""
    from types import SimpleNamespace

    from localpers.bundle.format import bundle_in_use_sha256
    from localpers.methods.card.method import profile_for_rewrite
    from localpers.methods.card.user_state import check_stored_fit

    user = fitted_user()
    state = json.loads(user.state_path.read_text())
    state.update(fit={"mode": "vector"}, bundle_sha256="b" * 64)
    user.state_path.write_text(json.dumps(state))
    bundle = SimpleNamespace(
        bundle_sha256="b" * 64, bundle=SimpleNamespace(k=3), head_config=SimpleNamespace(d=16)
    )
    with pytest.raises(
        LocalpersError, match="the vector has 8 values, but the bundle's head takes 16"
    ) as exc:
        profile_for_rewrite(user, "card", bundle, None)  # type: ignore[arg-type]
    assert exc.value.exit_code == MALFORMED and "localpers fit --user ann" in str(exc.value)
    with pytest.raises(LocalpersError, match="the vector has 8 values"):
        check_stored_fit(user, "b" * 64, 3, 16)
    check_stored_fit(user, "b" * 64, 3, 8)  # the width the head takes
    state["bundle_sha256"] = bundle_in_use_sha256()  # the demo bundle's head takes 128 values
    user.state_path.write_text(json.dumps(state))
    doctor = CliRunner().invoke(app, ["doctor", "--json"])
    assert json.loads(doctor.stdout)["users"]["unreadable"] == ["ann"]
    # no backbone found: the bundle's files are still read, and the fits checked against them (review, audit85)
    blind = CliRunner().invoke(app, ["doctor", "--json", "--model", "/nonexistent/backbone.gguf"])
    assert json.loads(blind.stdout)["users"]["unreadable"] == ["ann"], blind.output


def test_a_token_id_past_int32_is_damaged_not_an_overflow_at_rewrite() -> None:
    """A token id of 2^63 passed every check and every rewrite ended in an OverflowError traceback (audit85)."""
    from localpers.methods.card.user_state import check_stored_fit, stored_token_bias

    user = fitted_user()
    state = json.loads(user.state_path.read_text())
    state["token_bias"] = {"first": [], "rest": [[2**63, 1.0]]}
    user.state_path.write_text(json.dumps(state))
    for check in (lambda: stored_token_bias(user), lambda: check_stored_fit(user)):
        with pytest.raises(LocalpersError, match="field 'token_bias' is damaged") as exc:
            check()
        assert exc.value.exit_code == MALFORMED
