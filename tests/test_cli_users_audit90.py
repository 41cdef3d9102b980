"""The CLI and the user store under the ninetieth session's audit (its fourth of them).

Each test is a case that went wrong before: a user created or imported when the active pointer could not be
written reported as a failure (`{"ok": false}`, exit 1: a retry found the name taken); a delete that had removed
the user reported the pointer it could not remove as a bare OSError, leaving the user's files behind; `--no-use`
made the user active all the same; one unreadable user folder stopped `doctor` before its report; standard input
read whole whatever its size; a users folder that is a link to nothing read as "no user yet, create one"; a
looping link of the user's own files blamed on the export's destination; a stop after the history was saved
reported as of unknown effect.
"""

from __future__ import annotations

import json
from pathlib import Path

from cli_helpers import invoke, one_line_error

from localpers.users.store import UserStore


def pointer_made_a_folder() -> UserStore:
    """A store with user ann, whose active.json is a folder: it can be neither written nor removed."""
    store = UserStore()
    store.create("ann")
    store.active_path.unlink()
    store.active_path.mkdir()
    return store


def test_a_user_created_when_the_pointer_cannot_be_written_is_reported_as_created() -> None:
    store = pointer_made_a_folder()
    made = invoke("user", "create", "bob", "--json")
    assert made.exit_code == 0, (made.stdout, made.stderr)
    report = json.loads(made.stdout)
    assert report["name"] == "bob" and report["active"] is False
    assert "not made active" in report["note"] and "localpers user use bob" in report["note"]
    assert "bob" in store.list()
    plain = invoke("user", "create", "cy")
    assert plain.exit_code == 0 and "created user 'cy'" in plain.stdout
    assert (
        plain.stderr.startswith("note: user 'cy' was not made active") and len(plain.stderr.splitlines()) == 1
    )


def test_a_user_imported_with_use_when_the_pointer_cannot_be_written_is_reported_as_imported(
    tmp_path: Path,
) -> None:
    store = UserStore()
    store.create("ann")
    assert invoke("user", "export", "ann", "-o", str(tmp_path / "a.zip")).exit_code == 0
    store.active_path.unlink()
    store.active_path.mkdir()
    imported = invoke("user", "import", str(tmp_path / "a.zip"), "--as", "bob", "--use", "--json")
    assert imported.exit_code == 0, (imported.stdout, imported.stderr)
    report = json.loads(imported.stdout)
    assert report["active"] is False and "not made active" in report["note"]
    assert "bob" in store.list()


def test_a_delete_that_cannot_remove_the_pointer_still_deletes_every_file() -> None:
    store = pointer_made_a_folder()
    (store.active_path / "x").write_text("")  # not even rmdir could take it
    deleted = invoke("user", "delete", "ann", "-y")
    assert deleted.exit_code == 0, (deleted.stdout, deleted.stderr)
    assert "deleted user 'ann'" in deleted.stdout
    assert deleted.stderr.startswith("note: ") and "could not be removed" in deleted.stderr
    assert "move it away or make its folder writable" in deleted.stderr
    assert len(deleted.stderr.splitlines()) == 1
    assert store.list() == []
    assert [p.name for p in store.users_dir.iterdir()] == []  # no hidden .deleting-* folder left


def test_no_use_keeps_a_new_or_imported_user_inactive(tmp_path: Path) -> None:
    store = UserStore()
    created = invoke("user", "create", "ann", "--no-use", "--json")
    assert created.exit_code == 0 and json.loads(created.stdout)["active"] is False
    assert store.active_name() is None
    assert invoke("user", "export", "ann", "-o", str(tmp_path / "a.zip")).exit_code == 0
    imported = invoke("user", "import", str(tmp_path / "a.zip"), "--as", "bob", "--no-use", "--json")
    assert imported.exit_code == 0 and json.loads(imported.stdout)["active"] is False
    assert store.active_name() is None
    # without either flag an import is made active when no user is, and left inactive when one is (or when the
    # pointer is damaged: left for `user use` to mend, and nothing said of an activation not asked for)
    assert json.loads(invoke("user", "import", str(tmp_path / "a.zip"), "--as", "cy", "--json").stdout)[
        "active"
    ]
    assert not json.loads(invoke("user", "import", str(tmp_path / "a.zip"), "--as", "dee", "--json").stdout)[
        "active"
    ]
    assert store.active_name() == "cy"
    store.active_path.write_text("garbage")
    quiet = invoke("user", "import", str(tmp_path / "a.zip"), "--as", "eve")
    assert quiet.exit_code == 0 and quiet.stderr == "", quiet.stderr
    assert store.active_path.read_text() == "garbage"


def test_doctor_reports_a_user_folder_it_cannot_read_and_goes_on(monkeypatch, tmp_path: Path) -> None:
    store = UserStore()
    store.create("ann")
    bob = store.create("bob")
    exists = Path.exists

    def unreadable_for_bob(path: Path, *args, **kwargs) -> bool:
        if path.parent == bob.dir:  # what Path.exists raises under a folder this account cannot search
            raise PermissionError(13, "Permission denied", str(path))
        return exists(path, *args, **kwargs)

    monkeypatch.setattr(Path, "exists", unreadable_for_bob)
    monkeypatch.setenv("LOCALPERS_MODEL", str(tmp_path / "nothere.gguf"))  # no model is loaded
    result = invoke("doctor", "--json")
    report = json.loads(result.stdout)
    assert "error" not in report and report["users"]["unreadable"] == ["bob"], report
    assert report["users"]["count"] == 2
    shown = invoke("user", "show", "bob")  # the same cause, one line naming the file
    one_line_error(shown, "cannot read (Permission denied); give your account access to its folder", code=1)


def test_standard_input_is_read_up_to_a_bound(monkeypatch) -> None:
    from localpers.users import history

    monkeypatch.setattr(history, "MAX_HISTORY_FILE_BYTES", 1000)
    UserStore().create("ann")
    refused = invoke("history", "add", "-i", "-", "-o", "Council votes", stdin="a" * 1001)
    one_line_error(refused, "standard input holds more than the 1,000 bytes")
    assert UserStore().get("ann").history() == []
    kept = invoke("history", "add", "-i", "-", "-o", "Council votes", stdin="a" * 500)
    assert kept.exit_code == 0, kept.stderr


def test_a_users_folder_linked_to_nothing_is_named_not_read_as_no_user(tmp_path: Path) -> None:
    store = UserStore()
    store.create("ann")
    store.users_dir.rename(tmp_path / "on-the-drive")
    store.users_dir.symlink_to(tmp_path / "unmounted" / "users")
    for command in (["history", "list"], ["user", "show", "ann"], ["user", "delete", "ann", "-y"], ["fit"]):
        line = one_line_error(
            invoke(*command), f"{store.users_dir} is a link to {tmp_path / 'unmounted'}", code=1
        )
        assert "reconnect what it points to, or remove the link" in line and "user create" not in line


def test_a_user_folder_linked_to_nothing_is_named_not_read_as_no_such_user(tmp_path: Path) -> None:
    store = UserStore()
    ann = store.create("ann")
    ann.dir.rename(tmp_path / "ann-elsewhere")
    ann.dir.symlink_to(tmp_path / "gone")
    for command in (["history", "list"], ["user", "delete", "ann", "-y"]):
        line = one_line_error(invoke(*command), f"{ann.dir} is a link to {tmp_path / 'gone'}", code=1)
        assert "user create" not in line


def test_a_looping_link_among_the_users_files_is_not_blamed_on_the_export_destination(tmp_path: Path) -> None:
    store = UserStore()
    ann = store.create("ann")
    ann.history_path.symlink_to(ann.history_path.name)  # history.jsonl -> itself
    exported = invoke("user", "export", "ann", "-o", str(tmp_path / "a.zip"))  # without the history
    assert exported.exit_code == 0, exported.stderr
    assert (tmp_path / "a.zip").is_file()
    with_history = invoke("user", "export", "ann", "--with-history", "-o", str(tmp_path / "b.zip"))
    assert with_history.exit_code != 0 and "b.zip" not in with_history.stderr, with_history.stderr


def test_an_export_path_that_cannot_be_written_is_a_bad_argument_whichever_way_it_is_written(
    tmp_path: Path,
) -> None:
    UserStore().create("ann")
    one_line_error(
        invoke("user", "export", "ann", "-o", str(tmp_path / "nodir" / "a.zip")), "is not a folder"
    )
    (tmp_path / "d" / "localpers-user-ann.zip").mkdir(parents=True)
    line = one_line_error(invoke("user", "export", "ann", "-o", str(tmp_path / "d")), "is not a regular file")
    assert "(a folder, device, FIFO or socket)" in line


def test_a_stop_while_the_history_index_is_written_says_the_history_was_saved(
    monkeypatch, tmp_path: Path
) -> None:
    from localpers.users.history_index import HistoryIndex

    def stopped(*args, **kwargs) -> None:
        raise KeyboardInterrupt

    UserStore().create("ann")
    monkeypatch.setattr(HistoryIndex, "write", stopped)
    added = invoke("history", "add", "-i", "The council met", "-o", "Council meets")
    assert added.exit_code == 130
    assert "this came after the work was saved: user 'ann' now has 1 item" in added.stderr, added.stderr
    assert len(UserStore().get("ann").history()) == 1
    source = tmp_path / "more.jsonl"
    source.write_text('{"input": "Rates rose", "output": "Rates rise"}\n')
    imported = invoke("history", "import", str(source))
    assert imported.exit_code == 130 and "now has 2 items" in imported.stderr, imported.stderr
    removed = invoke("history", "remove", "--oldest", "1")
    assert removed.exit_code == 130 and "now has 1 item" in removed.stderr, removed.stderr


def test_a_fit_in_a_folder_it_cannot_write_is_refused_before_its_work(monkeypatch, backbone) -> None:
    import os

    from localpers.methods.card.method import CardMethod

    ann = UserStore().create("ann")
    assert invoke("history", "add", "-i", "The council met", "-o", "Council meets").exit_code == 0
    (ann.dir / ".fit.lock").touch()  # an earlier fit's: opening it needs no write access to the folder
    access = os.access
    monkeypatch.setattr(
        os, "access", lambda path, mode, **kw: Path(path) != ann.dir and access(path, mode, **kw)
    )

    def no_work(*args, **kwargs):
        raise AssertionError("the fit's work started")

    real_fit = CardMethod.fit
    monkeypatch.setattr(CardMethod, "fit", no_work)
    refused = invoke("fit", "--model", str(backbone.path))
    one_line_error(refused, f"{ann.dir}, the folder of user 'ann', cannot be written", code=1)
    monkeypatch.setattr(CardMethod, "fit", real_fit)
    monkeypatch.setattr(os, "access", access)
    fitted = invoke("fit", "--model", str(backbone.path))
    assert fitted.exit_code == 0, fitted.stderr
    monkeypatch.setattr(
        os, "access", lambda path, mode, **kw: Path(path) != ann.dir and access(path, mode, **kw)
    )
    unchanged = invoke("fit", "--model", str(backbone.path))  # nothing to do, nothing to write: as before
    assert unchanged.exit_code == 0 and "nothing to do" in unchanged.stderr, unchanged.stderr


def test_doctor_reports_a_users_folder_it_cannot_search_and_goes_on(monkeypatch, tmp_path: Path) -> None:
    store = UserStore()
    store.create("ann")  # active: doctor reads its folder through the pointer too
    is_dir, exists = Path.is_dir, Path.exists

    def denied(path: Path) -> None:
        if path.parent == store.users_dir:  # what Python raises under a folder this account cannot search
            raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(Path, "is_dir", lambda self: denied(self) or is_dir(self))
    monkeypatch.setattr(Path, "exists", lambda self, **kw: denied(self) or exists(self, **kw))
    monkeypatch.setenv("LOCALPERS_MODEL", str(tmp_path / "nothere.gguf"))
    result = invoke("doctor", "--json")
    report = json.loads(result.stdout)
    assert "error" not in report, report
    assert "Permission denied" in report["users"]["active_problem"], report["users"]
