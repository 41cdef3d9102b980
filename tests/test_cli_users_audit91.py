"""The user store and its commands under the ninety-first session's audit.

Each test is a case that went wrong before: with a folder where localpers keeps the active user's name,
`user use` (and the note of a `user create` that could not make its user active) advised "choose a file path",
a path no user chooses.
"""

from __future__ import annotations

from typer.testing import CliRunner

from localpers.cli import app
from localpers.users.store import UserStore

runner = CliRunner()


def test_a_folder_at_the_active_pointer_is_to_be_moved_away_not_a_path_to_choose() -> None:
    store = UserStore()
    store.create("ann")
    store.active_path.unlink()
    store.active_path.mkdir()
    used = runner.invoke(app, ["user", "use", "ann"])
    lines = used.stderr.strip().splitlines()
    assert used.exit_code == 1 and len(lines) == 1, (used.exit_code, used.stderr)
    assert str(store.active_path) in lines[0] and "move it away" in lines[0], lines[0]
    assert "choose" not in lines[0]
    made = runner.invoke(app, ["user", "create", "bob"])
    assert made.exit_code == 0 and "move it away" in made.stderr and "choose" not in made.stderr, made.stderr
    assert store.active_path.is_dir() and store.list() == ["ann", "bob"]
