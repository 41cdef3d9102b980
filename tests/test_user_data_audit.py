"""User data under odd input and damage (an audit of the user, history and fit paths).

Each test is a case that failed before: a history grown past what its reader accepts (every command on the user
refused, `history remove` included), a file name that is not UTF-8 (a traceback), side files damaged by hand
(tracebacks where a rebuild or one line was promised), a user folder that is a link (its files left behind by
`delete`), a full disk while the index cache is written (the command said it failed after the history changed), a
history holding one item twice (never removable), an export into the user's own folder, a stray file with a
user's name, and a pretty-printed JSON file given as history.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from localpers.cli import app
from localpers.errors import InputError, LocalpersError, StorageError
from localpers.users import history as history_module
from localpers.users import history_import
from localpers.users.history import HistoryItem
from localpers.users.history_import import parse_history
from localpers.users.store import UserStore


def items(n: int, size: int = 10) -> list[HistoryItem]:
    return [
        HistoryItem.create("headline", f"article {k} " + "word " * size, f"Headline {k}") for k in range(n)
    ]


def test_a_history_the_reader_would_refuse_is_never_written(monkeypatch: pytest.MonkeyPatch) -> None:
    user = UserStore().create("ann")
    user.save_history(items(2))
    before = user.history_path.read_bytes()
    monkeypatch.setattr(history_module, "MAX_HISTORY_FILE_BYTES", 2_000)
    with pytest.raises(
        InputError, match=r"would be [\d,]+ bytes, more than the 2,000 .* nothing was written"
    ):
        user.save_history(items(3, size=200))
    assert user.history_path.read_bytes() == before
    assert len(user.history()) == 2  # still readable, so every command still works


def test_a_history_grown_past_the_limit_by_hand_is_refused_saying_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusal gave two byte counts and nothing to do, and every command refuses such a history."""
    user = UserStore().create("ann")
    user.save_history(items(3, size=200))
    monkeypatch.setattr(history_module, "MAX_HISTORY_FILE_BYTES", 2_000)  # as two histories joined by hand
    with pytest.raises(
        InputError,
        match=r"history.jsonl is [\d,]+ bytes, more than the 2,000 .*joined or edited by hand\?\): move it",
    ):
        user.history()
    joined = tmp_path / "joined.jsonl"
    joined.write_bytes(user.history_path.read_bytes())
    with pytest.raises(InputError, match=r"more than the 2,000 a history file may have; split it$"):
        history_import.parse_history_file(joined)
    with pytest.raises(
        InputError, match=r"^- holds more than the 2,000 bytes a history file may have; split it$"
    ):
        history_import.parse_history("-", data=joined.read_bytes())  # `history import -`, piped in


def test_an_item_longer_than_any_prompt_reads_by_far_is_refused_naming_its_line(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    huge = "word " * 30_000  # 150,000 characters
    path.write_text(
        json.dumps({"input": "a b", "output": "c d"}) + "\n" + json.dumps({"input": huge, "output": "x"})
    )
    with pytest.raises(
        InputError, match=r"big.jsonl line 2: field 'input' has 149,999 characters; .* at most 100,000"
    ):
        parse_history(path)


def test_a_file_name_that_is_not_utf8_is_imported(tmp_path: Path) -> None:
    path = Path(os.fsdecode(bytes(tmp_path) + b"/ok\xff.jsonl"))
    path.write_text(json.dumps({"input": "an article", "output": "A Headline"}) + "\n")
    UserStore().create("ann")
    result = CliRunner().invoke(app, ["history", "import", str(path)])
    assert result.exit_code == 0, result.stderr
    (item,) = UserStore().get("ann").history()
    assert item.source == "ok\ufffd.jsonl:1"


def test_damaged_fit_caches_read_as_empty(localpers_home: Path) -> None:
    from localpers.methods.card.pair_cache import NEGATIVES_FILE, read_negatives, write_negatives

    user = UserStore().create("ann")
    write_negatives(user.dir, "key", {"item": "y minus", "other": "text"})
    assert read_negatives(user.dir, "key") == {"item": "y minus", "other": "text"}
    (user.dir / NEGATIVES_FILE).write_text(json.dumps({"key": {"item": 5, "other": "text"}}))
    assert read_negatives(user.dir, "key") == {"other": "text"}  # a number is no y-: made again
    (user.dir / NEGATIVES_FILE).write_text("[" * 100_000 + "]" * 100_000)
    assert read_negatives(user.dir, "key") == {}


def test_the_y_minus_cache_keeps_this_fits_entries_and_the_newest_others_up_to_its_cap(
    localpers_home: Path,
) -> None:
    """Every history change gives later items new prompts: the file grew by a history's worth each time (scale audit)."""
    from localpers.methods.card.pair_cache import NEGATIVES_FILE_ENTRIES, read_negatives, write_negatives

    user = UserStore().create("ann")
    known = {f"item{n}:prompt": f"y- {n}" for n in range(NEGATIVES_FILE_ENTRIES + 300)}
    used = [f"item{n}:prompt" for n in range(10)]  # this fit's prompts may be the oldest entries
    write_negatives(user.dir, "key", known, used)
    kept = read_negatives(user.dir, "key")
    assert len(kept) == NEGATIVES_FILE_ENTRIES
    assert set(used) <= set(kept)
    newest = [f"item{n}:prompt" for n in range(len(known) - (NEGATIVES_FILE_ENTRIES - len(used)), len(known))]
    assert set(kept) == set(used) | set(newest)


def test_a_history_index_with_pairs_that_are_not_text_is_rebuilt() -> None:
    from localpers.tasks import get_task
    from localpers.users.history_index import INDEX_FILE

    user = UserStore().create("ann")
    user.save_history(items(3))
    cache = json.loads((user.dir / INDEX_FILE).read_text())
    cache["tasks"]["headline"][0] = [1, 2]
    (user.dir / INDEX_FILE).write_text(json.dumps(cache))
    index = user.history_index(get_task("headline"))
    assert len(index.pool) == 3 and all(isinstance(text, str) for pair in index.pool for text in pair)


@pytest.mark.parametrize("text", ['{"rank": 1e999, "n_items": 3}', "[" * 100_000 + "]" * 100_000])
def test_a_damaged_cope_state_is_named_by_user_show_and_refused_by_cope_in_one_line(text: str) -> None:
    from localpers.methods.cope import load_state
    from localpers.methods.stored_files import COPE_STATE_FILE

    user = UserStore().create("ann")
    (user.dir / COPE_STATE_FILE).write_text(text)
    shown = CliRunner().invoke(app, ["user", "show"])
    assert shown.exit_code == 0, shown.stderr
    assert f"{COPE_STATE_FILE} is damaged" in shown.stdout
    with pytest.raises(LocalpersError, match=f"{COPE_STATE_FILE} is damaged"):
        load_state(user)


def test_a_cope_state_with_a_field_of_the_wrong_type_is_refused_in_one_line() -> None:
    from localpers.methods.cope import CopeState, load_state
    from localpers.methods.stored_files import COPE_STATE_FILE

    user = UserStore().create("ann")
    fields = {name: "x" for name in CopeState.__dataclass_fields__}
    state = {**fields, "cluster": None, "rank": 8, "alpha": 16.0, "n_items": 3, "steps": 1, "train_tokens": 5}
    state.update({"final_loss": None, "seconds": {}, "version": 1, "conditioned": False, "adapter_file": 5})
    (user.dir / COPE_STATE_FILE).write_text(json.dumps(state))
    with pytest.raises(LocalpersError, match=r"is damaged \(field 'adapter_file'\)"):
        load_state(user)


def test_deleting_a_user_whose_folder_is_a_link_deletes_nothing_and_says_so(tmp_path: Path) -> None:
    store = UserStore()
    store.create("ann").save_history(items(1))
    elsewhere = tmp_path / "elsewhere"
    os.rename(store.get("ann").dir, elsewhere)
    (store.users_dir / "ann").symlink_to(elsewhere)
    with pytest.raises(LocalpersError, match=r"is a link to .*elsewhere.*nothing was deleted"):
        store.delete("ann")
    assert (elsewhere / "history.jsonl").is_file() and store.list() == ["ann"]


def test_a_link_left_by_an_older_delete_is_swept_without_touching_its_target(tmp_path: Path) -> None:
    store = UserStore()
    store.create("ann")
    target = tmp_path / "target"
    target.mkdir()
    (target / "history.jsonl").write_text("kept")
    leftover = store.users_dir / ".deleting-999999999-abcdef"
    leftover.symlink_to(target)
    store.create("bob")  # any lookup sweeps leftovers
    assert not os.path.lexists(leftover) and (target / "history.jsonl").read_text() == "kept"


def test_a_delete_that_cannot_remove_every_file_names_the_full_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from localpers.users import staging

    store = UserStore()
    store.create("ann").save_history(items(1))
    monkeypatch.setattr(staging, "remove_tree", lambda path: [f"{path}/sub/f: Permission denied"])
    with pytest.raises(StorageError, match=r"could not be deleted \(first: .*/sub/f: Permission denied\)"):
        store.delete("ann")
    assert store.list() == []


def test_a_full_disk_while_the_index_cache_is_written_does_not_fail_the_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localpers.users import history_index

    user = UserStore().create("ann")
    user.save_history(items(1))

    def full(path: Path, text: str) -> None:
        raise StorageError(f"cannot write {path} (No space left on device)")

    monkeypatch.setattr(history_index, "atomic_write_text", full)
    path = tmp_path / "more.jsonl"
    path.write_text(
        "".join(json.dumps({"input": f"article {k}", "output": f"Head {k}"}) + "\n" for k in range(3))
    )
    result = CliRunner().invoke(app, ["history", "import", str(path)])
    assert result.exit_code == 0, result.stderr
    assert len(user.history()) == 4


def test_importing_only_items_already_there_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localpers.users.folder import User

    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps({"input": "an article", "output": "A Headline"}) + "\n")
    UserStore().create("ann")
    runner = CliRunner()
    assert runner.invoke(app, ["history", "import", str(path)]).exit_code == 0

    def no_space(self: User, items: list[HistoryItem]) -> None:
        raise StorageError("cannot write history.jsonl (No space left on device)")

    monkeypatch.setattr(User, "save_history", no_space)
    again = runner.invoke(app, ["history", "import", str(path)])
    assert again.exit_code == 0, again.stderr
    assert "imported 0 items" in again.stdout


def test_an_item_stored_twice_is_removed_with_its_copy() -> None:
    user = UserStore().create("ann")
    user.save_history(items(2))
    first = user.history_path.read_text().splitlines()[0]
    with user.history_path.open("a") as handle:
        handle.write(first + "\n")  # two history files joined by hand
    item_id = user.history()[0].id
    result = CliRunner().invoke(app, ["history", "remove", item_id])
    assert result.exit_code == 0, result.stderr
    assert f"removed {item_id} from user 'ann'; 1 item left" in result.stdout
    assert len(user.history()) == 1 and item_id not in {item.id for item in user.history()}
    assert len(user.history_path.read_text().splitlines()) == 1


def test_an_item_stored_twice_is_one_item() -> None:
    """Counted twice, a line repeated by hand (or two lines differing only by control characters, stored before
    import removed them) was a series the user repeats, two training pairs, and both the oldest item and the
    newest: `history remove --oldest 1` removed the newest item too."""
    from localpers.users.series import history_series

    user = UserStore().create("ann")
    outputs = ("Storm cuts power overnight", "Zoo welcomes two pandas", "Council backs solar roof")
    user.save_history([HistoryItem.create("headline", f"article {k}", out) for k, out in enumerate(outputs)])
    lines = user.history_path.read_text().splitlines(keepends=True)
    first = json.loads(lines[0])
    again = json.dumps(
        {**first, "output": first["output"] + "\x1b"}
    )  # a control character, removed on reading
    user.history_path.write_text("".join([*lines, lines[0], lines[0], again + "\n"]))
    assert [item.id for item in user.history()] == [json.loads(line)["id"] for line in lines]
    assert history_series(user.history()) == []
    result = CliRunner().invoke(app, ["history", "remove", "--oldest", "1"])
    assert result.exit_code == 0, result.stderr
    assert [item.id for item in user.history()] == [json.loads(line)["id"] for line in lines[1:]]


def test_export_into_the_users_folder_is_refused() -> None:
    store = UserStore()
    user = store.create("ann")
    user.save_history(items(1))
    before = user.history_path.read_bytes()
    for dest in (user.history_path, user.dir, store.users_dir):
        with pytest.raises(InputError, match="inside localpers' users folder"):
            store.export("ann", dest, with_history=True, overwrite=True)
    assert user.history_path.read_bytes() == before and not list(user.dir.glob("*.zip"))


def test_a_stray_file_with_a_users_name_is_named_with_what_to_do() -> None:
    store = UserStore()
    store.create("ann")
    (store.users_dir / "x").write_text("not a user")
    (store.users_dir / "y").symlink_to("/nonexistent")
    for name in ("x", "y"):
        with pytest.raises(
            LocalpersError, match=rf"users/{name} exists and is not a user's folder .* move it away"
        ):
            store.create(name)


def test_a_users_folder_that_cannot_be_written_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    store = UserStore()
    store.create("ann")
    real_mkdir = Path.mkdir

    def refuse(self: Path, *args: object, **kwargs: object) -> None:
        if self.name.startswith(".creating-"):
            raise PermissionError(13, "Permission denied", str(self))
        real_mkdir(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(StorageError, match=r"cannot write in .*users \(Permission denied\)") as refused:
        store.create("bob")
    assert ".creating-" not in str(refused.value)


def test_a_pretty_printed_json_file_is_told_that_history_is_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "arr.json"
    path.write_text(json.dumps([{"input": "a b", "output": "c d"}], indent=2))
    with pytest.raises(InputError, match=r"arr.json line 1: .* a history file is JSONL: one object per line"):
        parse_history(path)


def test_a_history_line_with_a_key_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "dup.jsonl"
    path.write_text('{"input": "x y", "output": "A", "input": "z w"}\n')
    with pytest.raises(InputError, match=r"dup.jsonl line 1: not valid JSON \(.*'input'.*\)"):
        parse_history(path)
