"""The CLI under the ninety-second session's audit (a new user's walk through the journey).

Each test is a case that went wrong before: `user create NAME --no-use` advised `localpers history import FILE`
without `--user NAME`, which fills the active user's history; `localpers demo` put back shipped items removed
from the demo user without a word; `profile` told a user with no history to fit (EXACT's fit then refuses); a
missing user named like a Windows device was told to create it, which `user create` refuses; a paraphrase item
too long for the history was told to "rewrite the parts"; `history import/add/remove` said "run `localpers fit`"
although the stored fit was of the history as it then stood; `history remove --oldest N` emptied a whole history
without asking; a 3-character id prefix read as "no history item"; and `history remove` given neither an ID nor
--oldest said "(not both)".
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_helpers import invoke, one_line_error

from localpers.tasks import TASKS
from localpers.users.history import HistoryItem, history_digest
from localpers.users.store import User, UserStore


def items(count: int, start: int = 0) -> list[HistoryItem]:
    return [
        HistoryItem.create("headline", f"Article {n}.", f"Headline {n}") for n in range(start, start + count)
    ]


def user_with(name: str, history: list[HistoryItem]) -> User:
    user = UserStore().create(name)
    user.save_history(history)
    return user


def test_the_next_hint_after_no_use_names_the_new_user() -> None:
    invoke("user", "create", "alice")
    made = invoke("user", "create", "mona", "--no-use")
    assert made.exit_code == 0, made.stderr
    assert (
        "next: `localpers history import FILE --user mona` or `localpers history add --input ... --output ..."
        " --user mona`" in made.stdout
    )
    # followed as printed, the item lands in mona's history, not in the active alice's
    followed = invoke("history", "add", "--input", "An article.", "--output", "A Headline", "--user", "mona")
    assert followed.exit_code == 0 and len(UserStore().get("mona").history()) == 1
    assert UserStore().get("alice").history() == []
    active = invoke("user", "create", "nell")  # made active: a bare command acts on it
    assert "next: `localpers history import FILE` or" in active.stdout and "--user" not in active.stdout


def test_the_demo_says_it_put_back_shipped_items_removed_from_the_demo_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from localpers.device import demo as demo_module
    from localpers.methods.card import personalizer as personalizer_module
    from localpers.users.history import demo_history_path
    from localpers.users.history_import import parse_history_file

    shipped = parse_history_file(demo_history_path())
    user_with("demo", shipped[2:])  # `history remove --oldest 2 --user demo`

    def fit_user(user: User, progress: object = None) -> None:
        user.save_state({"fit": {"mode": "vector", "n_items": len(shipped)}})

    fake = SimpleNamespace(bundle_sha256="b" * 64, fit_user=fit_user)
    monkeypatch.setattr(personalizer_module.Personalizer, "open", staticmethod(lambda **kwargs: fake))
    monkeypatch.setattr(demo_module, "compare_on_demo", lambda *args, **kwargs: [])
    shown = invoke("demo", "--json")
    assert shown.exit_code == 0, (shown.stderr, shown.exception)
    assert json.loads(shown.stdout)["fitted_now"] is True
    assert shown.stderr == (
        "note: put back 2 shipped examples that were missing from the demo user's history (the demo shows the"
        " shipped user)\n"
    )
    assert [item.id for item in UserStore().get("demo").history()] == [item.id for item in shipped]
    again = invoke("demo", "--json")  # nothing missing: nothing said
    assert again.exit_code == 0 and again.stderr == "", again.stderr


def test_profile_of_a_user_without_history_says_to_import_it_before_fitting() -> None:
    UserStore().create("bob")
    shown = invoke("profile", "--user", "bob")
    assert shown.exit_code == 0, shown.stderr
    text = " ".join(shown.stdout.split())  # rich may wrap a long line
    assert (
        "CARD: not fitted (run `localpers history import FILE --user bob`, then `localpers fit --user bob`)"
        in text
    )
    assert (
        "EXACT: no index (run `localpers history import FILE --user bob`, then `localpers fit --method exact"
        " --user bob`)" in text
    )


def test_a_missing_user_is_told_to_create_it_only_under_a_name_create_takes() -> None:
    for command in (["user", "use", "con"], ["history", "list", "--user", "nul"]):
        line = one_line_error(invoke(*command), "no user named", code=1)
        assert "user create" not in line and "`localpers user list` shows the users" in line
    line = one_line_error(invoke("user", "use", "zed"), "no user named 'zed'", code=1)
    assert "`localpers user create zed` makes one" in line
    one_line_error(invoke("user", "create", "con"), "is a device name on Windows")


def test_a_paraphrase_item_too_long_for_the_history_is_told_to_split_it_into_items(tmp_path: Path) -> None:
    UserStore().create("carol")
    limit = TASKS["paraphrase"].max_input_chars
    long_text = "p" * (limit + 1)
    added = invoke("history", "add", "-i", long_text, "-o", "x", "--task", "paraphrase")
    line = one_line_error(added, f"split it into items of at most {limit:,} characters")
    assert "rewrite" not in line
    source = tmp_path / "longpara.jsonl"
    source.write_text(json.dumps({"task": "paraphrase", "input": long_text, "output": "x"}) + "\n")
    line = one_line_error(invoke("history", "import", str(source)), "line 1: field 'input' has")
    assert f"split it into items of at most {limit:,} characters" in line and "rewrite" not in line
    assert UserStore().get("carol").history() == []
    # a rewrite's refusal keeps its own advice
    with pytest.raises(Exception, match="split it and rewrite the parts one at a time"):
        TASKS["paraphrase"].check_text(long_text)


def fitted_on(user: User, history: list[HistoryItem]) -> None:
    """A stored CARD fit of `history` (as `fit` records it)."""
    user.save_state(
        {"fit": {"mode": "vector", "n_items": len(history), "history_sha256": history_digest(history)}}
    )


def test_no_refit_reminder_when_the_stored_fit_is_of_the_history_now(tmp_path: Path) -> None:
    fitted = items(2)
    ann = user_with("ann", fitted[:1])
    fitted_on(ann, fitted)
    source = tmp_path / "rest.jsonl"
    source.write_text(json.dumps({"input": fitted[1].input, "output": fitted[1].output}) + "\n")
    imported = invoke("history", "import", str(source), "--user", "ann")  # brings back what was fitted
    assert imported.exit_code == 0 and "imported 1 item" in imported.stdout, imported.stderr
    assert "localpers fit" not in imported.stdout
    added = invoke("history", "add", "-i", "Article 9.", "-o", "Headline 9", "--user", "ann")
    assert "run `localpers fit --user ann` to refit" in added.stdout  # the fit has not seen it
    new_id = UserStore().get("ann").history()[-1].id
    removed = invoke("history", "remove", new_id, "--user", "ann")  # the item added a moment before
    assert removed.exit_code == 0 and f"removed {new_id}" in removed.stdout, removed.stderr
    assert "localpers fit" not in removed.stdout
    # a CoPe adapter fitted on another history is still named, though CARD's fit is current
    bea = user_with("bea", fitted[:1])
    fitted_on(bea, fitted)
    (bea.dir / "cope.json").write_text(json.dumps({"history_sha256": history_digest(fitted[:1])}))
    cope_due = invoke("history", "add", "-i", fitted[1].input, "-o", fitted[1].output, "--user", "bea")
    assert (
        "rewrites use the history now; run `localpers fit --method cope --user bea` for the CoPe adapter"
        in (cope_due.stdout)
    )
    assert "`localpers fit --user bea`" not in cope_due.stdout


def test_oldest_n_that_would_empty_the_history_asks_first(monkeypatch: pytest.MonkeyPatch) -> None:
    from localpers.cli import history_remove

    ivy = user_with("ivy", items(6))
    refused = invoke("history", "remove", "--oldest", "600", "--user", "ivy")  # no terminal to ask at
    one_line_error(
        refused, "--oldest 600 would remove the whole history of user 'ivy' (6 items); add `--yes`", code=1
    )
    assert len(ivy.history()) == 6
    fewer = invoke("history", "remove", "--oldest", "2", "--user", "ivy")  # not all of it: as before
    assert fewer.exit_code == 0 and "4 items left" in fewer.stdout, fewer.stderr
    monkeypatch.setattr(history_remove, "asks_a_person", lambda: True)
    declined = invoke("history", "remove", "--oldest", "4", "--user", "ivy", stdin="n\n")
    # asked on stderr, with or without --json: seen when stdout is redirected
    assert declined.exit_code == 1 and "Remove the whole history of user 'ivy' (4 items)?" in declined.stderr
    assert "error: nothing was removed from user 'ivy'" in declined.stderr and len(ivy.history()) == 4
    agreed = invoke("history", "remove", "--oldest", "4", "--user", "ivy", "--json", stdin="y\n")
    assert agreed.exit_code == 0, agreed.stderr
    # the question went to stderr; stdout has the JSON after the answer CliRunner echoes (a terminal echoes it)
    assert "Remove the whole history" in agreed.stderr and "Remove" not in agreed.stdout
    assert json.loads(agreed.stdout[agreed.stdout.index("{") :])["total"] == 0 and ivy.history() == []
    monkeypatch.setattr(history_remove, "asks_a_person", lambda: False)
    ivy.save_history(items(3))
    forced = invoke("history", "remove", "--oldest", "3", "--user", "ivy", "-y")
    assert forced.exit_code == 0 and "0 items left" in forced.stdout, forced.stderr


def test_an_id_prefix_under_four_characters_is_refused_as_too_short() -> None:
    frank = user_with("frank", items(40))
    prefix = frank.history()[0].id[:3]
    for given in (prefix, "zz"):
        one_line_error(
            invoke("history", "remove", given, "--user", "frank"),
            f"{given!r} is too short: give at least 4 characters of an id from `localpers history list`",
        )
    assert len(frank.history()) == 40


def test_remove_with_neither_id_nor_oldest_does_not_say_not_both() -> None:
    user_with("jay", items(2))
    line = one_line_error(invoke("history", "remove", "--user", "jay"), "give an item ID or --oldest N")
    assert "not both" not in line
    both = invoke(
        "history", "remove", UserStore().get("jay").history()[0].id, "--oldest", "1", "--user", "jay"
    )
    one_line_error(both, "give an item ID or --oldest N (not both)")
