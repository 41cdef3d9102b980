"""The user store under damage and odd paths (eighty-sixth session's second audit of it).

Each test is a case that failed before: a damaged or encrypted member of an imported archive (a traceback), NaN
or 1e999 in a state (accepted, then `user export` ended in a traceback), a history or state behind a link to
nothing (left out of an export that said "with history"), a 400-digit number in an imported fit report (`user
show` ended in a traceback), a damaged active.json (a finished import or create exited 2), an export path that
loops or is the user's own linked history, a failed rename reported as "already exists", and a "date" that only
starts like one.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import struct
import zipfile
from pathlib import Path

import pytest
from cli_helpers import invoke, one_line_error

from localpers.errors import StorageError
from localpers.users import store as store_module
from localpers.users.store import UserStore


def archive(path: Path, state: bytes, name: str = "bob", method: int = zipfile.ZIP_DEFLATED) -> Path:
    manifest = {
        "format": "localpers-user",
        "format_version": 1,
        "name": name,
        "files": {"state.json": hashlib.sha256(state).hexdigest()},
    }
    with zipfile.ZipFile(path, "w") as zipped:
        zipped.writestr("manifest.json", json.dumps(manifest))
        zipped.writestr("state.json", state, compress_type=method)
    return path


def flip_member_data(path: Path, member: str, skip: int) -> None:
    """Damage `member`'s compressed bytes after the first `skip`, as a bit-flipped download does (its sizes left as
    declared)."""
    data = bytearray(path.read_bytes())
    info = zipfile.ZipFile(path).getinfo(member)
    start = info.header_offset + 30 + len(info.filename) + len(info.extra) + skip
    for offset in range(start, start + 38):
        data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


# past deflate's block header (zlib.error), into LZMA's properties (LZMAError "Invalid or unsupported options")
@pytest.mark.parametrize(("method", "skip"), [(zipfile.ZIP_DEFLATED, 2), (zipfile.ZIP_LZMA, 4)])
def test_an_archive_whose_member_is_damaged_is_one_line(tmp_path: Path, method: int, skip: int) -> None:
    path = archive(tmp_path / "a.zip", b'{"created_at":"x","pad":"' + b"a b c " * 2000 + b'"}', method=method)
    flip_member_data(path, "state.json", skip)
    one_line_error(invoke("user", "import", str(path)), "is not a localpers user archive")
    assert UserStore().list() == []


def test_an_archive_with_an_encrypted_member_is_one_line(tmp_path: Path) -> None:
    path = archive(tmp_path / "a.zip", b'{"created_at":"x"}')
    data = bytearray(path.read_bytes())
    central = data.find(b"PK\x01\x02")
    flags = struct.unpack_from("<H", data, central + 8)[0]
    struct.pack_into("<H", data, central + 8, flags | 1)
    path.write_bytes(bytes(data))
    one_line_error(invoke("user", "import", str(path)), "manifest.json is encrypted")


@pytest.mark.parametrize("value", [b"1e999", b"NaN", b"-Infinity"])
def test_a_state_holding_no_json_number_is_refused_on_import(tmp_path: Path, value: bytes) -> None:
    """Accepted before; `user export` then ended in "ValueError: Out of range float values"."""
    path = archive(tmp_path / "a.zip", b'{"created_at":"x","extra":' + value + b"}")
    one_line_error(invoke("user", "import", str(path)), "holds a damaged user")
    assert UserStore().list() == []


def test_a_local_state_holding_nan_is_damaged_not_exported(tmp_path: Path) -> None:
    user = UserStore().create("ann")
    user.state_path.write_text('{"created_at": "x", "cluster": NaN}\n')
    one_line_error(invoke("user", "export", "ann", "-o", str(tmp_path / "a.zip")), "is damaged")
    assert not (tmp_path / "a.zip").exists()


def test_export_refuses_a_history_or_state_behind_a_link_to_nothing(tmp_path: Path) -> None:
    """A history on a drive not mounted now: the archive said "(with history)" and held none."""
    user = UserStore().create("ann")
    user.history_path.symlink_to(tmp_path / "unmounted" / "history.jsonl")
    result = invoke("user", "export", "ann", "--with-history", "-o", str(tmp_path / "a.zip"))
    one_line_error(result, "which does not exist; reconnect what it points to", code=1)
    assert not (tmp_path / "a.zip").exists()
    user.history_path.unlink()
    user.state_path.unlink()
    user.state_path.symlink_to(tmp_path / "unmounted" / "state.json")
    result = invoke("user", "export", "ann", "-o", str(tmp_path / "a.zip"))
    one_line_error(result, "which does not exist; reconnect what it points to before exporting", code=1)
    assert not (tmp_path / "a.zip").exists()


def test_user_show_survives_a_number_no_float_holds(tmp_path: Path) -> None:
    """An imported state's fit report with a 400-digit integer: `user show` ended in an OverflowError."""
    huge = b"1" + b"0" * 400
    state = (
        b'{"created_at":"x","fit":{"mode":"vector","n_pairs":4,"n_heldout":2,"heldout_accuracy":'
        + huge
        + b',"seconds":{"a":'
        + huge
        + b',"b":1.5}}}'
    )
    assert invoke("user", "import", str(archive(tmp_path / "a.zip", state))).exit_code == 0
    shown = invoke("user", "show", "bob")
    assert shown.exit_code == 0, (shown.stderr, shown.exception)
    assert "4 pairs; 1.5 s" in shown.stdout


def test_a_damaged_active_pointer_fails_no_finished_command(tmp_path: Path) -> None:
    store = UserStore()
    store.create("ann")
    assert invoke("user", "export", "ann", "-o", str(tmp_path / "a.zip")).exit_code == 0
    store.active_path.write_text("garbage")
    imported = invoke("user", "import", str(tmp_path / "a.zip"), "--as", "ann2")
    assert imported.exit_code == 0 and "imported user 'ann2'" in imported.stdout, imported.stderr
    created = invoke("user", "create", "ann3", "--no-use")
    assert created.exit_code == 0 and "created user 'ann3'" in created.stdout, created.stderr
    shown = invoke("user", "show", "ann", "--json")
    assert shown.exit_code == 0 and json.loads(shown.stdout)["active"] is False, shown.stderr


def test_export_to_a_link_that_loops_is_one_line(tmp_path: Path) -> None:
    UserStore().create("ann")
    loop = tmp_path / "loop.zip"
    loop.symlink_to(loop)
    one_line_error(invoke("user", "export", "ann", "-o", str(loop)), "a link that loops")


def test_export_never_replaces_the_users_linked_history_or_the_active_pointer(tmp_path: Path) -> None:
    store = UserStore()
    user = store.create("ann")
    kept = tmp_path / "drive" / "history.jsonl"
    kept.parent.mkdir()
    kept.write_text(json.dumps({"task": "headline", "input": "article", "output": "Headline"}) + "\n")
    user.history_path.symlink_to(kept)
    before = kept.read_bytes()
    result = invoke("user", "export", "ann", "--with-history", "--force", "-o", str(kept))
    one_line_error(result, "is the file user 'ann' keeps its history in")
    assert kept.read_bytes() == before
    result = invoke("user", "export", "ann", "--force", "-o", str(store.active_path))
    one_line_error(result, "is localpers' own active.json")
    assert store.active_name() == "ann"


def test_export_never_replaces_a_link_to_nothing_without_force(tmp_path: Path) -> None:
    UserStore().create("ann")
    dangling = tmp_path / "dangling.zip"
    dangling.symlink_to(tmp_path / "elsewhere.zip")
    one_line_error(invoke("user", "export", "ann", "-o", str(dangling)), "already exists", code=1)
    assert dangling.is_symlink()


def test_a_failed_rename_is_not_called_a_taken_name(monkeypatch: pytest.MonkeyPatch) -> None:
    store = UserStore()

    def full_disk(source: str, target: str) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patched:  # not monkeypatch.undo(): that would undo the isolated home too
        patched.setattr(store_module.os, "rename", full_disk)
        with pytest.raises(
            StorageError, match="cannot put user 'ann' into .*No space left.*nothing was saved"
        ):
            store.create("ann")
    assert store.list() == []
    store.create("ann")  # and it works once the disk has room


@pytest.mark.parametrize("value", ["2024-01-01garbage", "2024-01-0112:00"])
def test_a_date_that_only_starts_like_one_is_refused(tmp_path: Path, value: str) -> None:
    UserStore().create("ann")
    dated = tmp_path / "dated.jsonl"
    lines = [
        {"input": "article a", "output": "Headline A", "date": "2024-05-01"},
        {"input": "article b", "output": "Headline B", "date": value},
    ]
    dated.write_text("".join(json.dumps(line) + "\n" for line in lines))
    one_line_error(invoke("history", "import", str(dated)), f"line 2: field 'date' is {value!r}")


@pytest.mark.parametrize(
    "value", ["2024-01-01T25:30", "2024-01-01 10:61", "2024-01-01T10:00+25:00", "2024-01-01 12:30garbage"]
)
def test_a_date_whose_clock_time_or_offset_is_none_is_refused(tmp_path: Path, value: str) -> None:
    """It was read as that day's midnight, silently reordering the history (audit88)."""
    UserStore().create("ann")
    dated = tmp_path / "dated.jsonl"
    lines = [
        {"input": "article a", "output": "Headline A", "date": "2024-01-01T12:00"},
        {"input": "article b", "output": "Headline B", "date": value},
    ]
    dated.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = invoke("history", "import", str(dated))
    assert result.exit_code == 2
    one_line_error(result, f"dated.jsonl line 2: field 'date' is {value!r}, not a valid ISO 8601 date")
    assert UserStore().get("ann").history() == []


def test_a_date_with_a_time_python_cannot_read_is_still_that_day(tmp_path: Path) -> None:
    UserStore().create("ann")
    dated = tmp_path / "dated.jsonl"
    lines = [
        {"input": "article b", "output": "Headline B", "date": "2024-05-02 09:00 UTC"},
        {"input": "article a", "output": "Headline A", "date": "2024-05-01"},
    ]
    dated.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert invoke("history", "import", str(dated)).exit_code == 0
    assert [item.output for item in UserStore().get("ann").history()] == ["Headline A", "Headline B"]


def test_an_archive_too_large_is_not_told_to_be_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localpers.users import archive as archive_module

    path = archive(tmp_path / "a.zip", b'{"created_at":"x"}')
    monkeypatch.setattr(archive_module, "MAX_ARCHIVE_FILE_BYTES", 100)
    result = invoke("user", "import", str(path))
    one_line_error(result, "`localpers user export` writes none so large: not a localpers user archive")
    assert "split" not in result.stderr


def test_a_history_limit_below_one_is_refused_not_read_as_every_item() -> None:
    # items[-0:] is every item: a caller asking for none (a script, the API's code) fitted on the whole history
    # (eighty-seventh session's methods audit); the command line already takes 1 or more
    from localpers.users.folder import history_for
    from localpers.users.history import HistoryItem
    from localpers.users.store import UserStore

    user = UserStore().create("limited")
    user.save_history([HistoryItem.create("headline", f"article {i}", f"HEADLINE {i}") for i in range(3)])
    assert [item.output for item in history_for(user, 2, "CoPe")] == ["HEADLINE 1", "HEADLINE 2"]
    with pytest.raises(ValueError, match="history_limit must be at least 1"):
        history_for(user, 0, "CoPe")
