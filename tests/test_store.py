"""User store: users and the active pointer, atomic fits, damaged files, export and import."""

import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save

from localpers.errors import InputError, LocalpersError
from localpers.users.history import HistoryItem
from localpers.users.store import UserStore

SECRET = "Zebra Quokka Manifesto"  # a distinctive bit of "user text" to hunt for on disk


def items(n: int) -> list[HistoryItem]:
    return [HistoryItem.create("headline", f"article {k}", f"{SECRET} {k}", "test") for k in range(n)]


def files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_create_list_use_resolve() -> None:
    store = UserStore()
    assert store.list() == [] and store.active_name() is None
    with pytest.raises(LocalpersError, match=r"^no active user: run `localpers user create NAME`$"):
        store.resolve(None)
    ann = store.create("ann")
    assert store.active_name() == "ann"  # the first user becomes active
    store.create("bob-2")
    assert store.list() == ["ann", "bob-2"] and store.active_name() == "ann"
    store.use("bob-2")
    assert store.resolve(None).name == "bob-2" and store.resolve("ann") == ann
    assert ann.history() == [] and ann.vector() is None and "created_at" in ann.state()


@pytest.mark.parametrize("name", ["", "Ann", "-ann", "a" * 33, "an n", "../x", "ann/"])
def test_invalid_names(name: str) -> None:
    with pytest.raises(LocalpersError, match="invalid user name"):
        UserStore().create(name)


def test_create_twice_and_unknown_user() -> None:
    store = UserStore()
    store.create("ann")
    with pytest.raises(LocalpersError, match="already exists"):
        store.create("ann")
    with pytest.raises(LocalpersError, match="no user named 'zed'"):
        store.get("zed")


def test_delete_removes_every_trace(localpers_home: Path) -> None:
    store = UserStore()
    ann = store.create("ann")
    store.create("bob")
    ann.save_history(items(3))
    ann.save_fit(np.ones(8, np.float32), {"cluster": 1}, {"bundle_sha256": "abc"})
    store.use("ann")
    store.delete("ann")
    assert store.list() == ["bob"] and store.active_name() is None
    assert not store.active_path.exists()
    assert not any(SECRET in p.read_text(errors="ignore") for p in files_under(localpers_home))
    assert not any("ann" in p.name for p in localpers_home.rglob("*"))
    with pytest.raises(LocalpersError, match="no user named 'ann'"):
        store.delete("ann")


def test_a_command_started_before_a_delete_never_writes_into_the_user_made_anew(localpers_home: Path) -> None:
    """A fit holds its User from before; the user is deleted and created again under the same name; the
    fit's save is refused by name and the new user keeps nothing of the old one's."""
    store = UserStore()
    store.create("ann").save_history(items(3))
    running = store.get("ann")  # what `localpers fit` holds while it computes
    store.delete("ann")
    fresh = store.create("ann")
    with pytest.raises(
        LocalpersError, match=r"^user 'ann' no longer exists \(deleted, or deleted and created anew"
    ):
        running.save_fit(np.ones(4, dtype=np.float32), {"cluster": 1})
    with pytest.raises(LocalpersError, match="no longer exists"):
        running.save_history(items(5))
    assert fresh.history() == [] and fresh.vector() is None and "cluster" not in fresh.state()
    fresh.save_fit(np.ones(4, dtype=np.float32), {"cluster": 1})  # the new user's own commands write
    assert store.get("ann").state()["cluster"] == 1


def test_a_folder_from_before_identity_tokens_gets_one() -> None:
    store = UserStore()
    store.create("ann")
    token_file = store.users_dir / "ann" / ".identity"
    token_file.unlink()  # as a folder made by an older localpers
    first = store.get("ann")
    assert first.identity is not None and token_file.read_text().strip() == first.identity
    assert store.get("ann").identity == first.identity and first == store.get("ann")
    first.save_state({"cluster": 0})


def test_a_token_that_could_not_be_written_is_not_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder without a token that cannot get one (full disk, read-only) stays unchecked, not unwritable."""
    from localpers.users import store as store_module

    store = UserStore()
    store.create("ann")
    (store.users_dir / "ann" / ".identity").unlink()

    def refuse(path: Path, text: str) -> None:
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(store_module, "atomic_write_text", refuse)
    ann = store.get("ann")
    monkeypatch.undo()
    assert ann.identity is None
    ann.save_state({"cluster": 0})  # still writes


def test_an_interrupted_delete_leaves_no_text_once_any_command_looks_up_a_user() -> None:
    store = UserStore()
    store.create("ann").save_history(items(3))
    leftover = store.users_dir / ".deleting-999999999-abcdef"  # its process is gone
    os.rename(store.users_dir / "ann", leftover)
    with pytest.raises(LocalpersError, match="no user named 'ann'"):
        store.get("ann")
    assert not leftover.exists()


def test_delete_keeps_another_users_active_pointer() -> None:
    store = UserStore()
    store.create("ann")
    store.create("bob")
    store.delete("bob")
    assert store.active_name() == "ann"


def test_user_text_stays_in_its_folder(localpers_home: Path) -> None:
    store = UserStore()
    ann = store.create("ann")
    ann.save_history(items(5))
    ann.save_fit(np.zeros(4, np.float32), {"cluster": 0})
    holders = [p for p in files_under(localpers_home) if SECRET in p.read_text(errors="ignore")]
    # The history and its retrieval index (derived from it), both in the user's own folder, and nowhere else.
    assert sorted(holders) == sorted([ann.history_path, ann.dir / "history_index.json"])
    assert not [p for p in files_under(localpers_home) if p.name.endswith(".tmp")]


def test_fit_round_trip_and_state_keys() -> None:
    ann = UserStore().create("ann")
    vector = np.linspace(-1, 1, 16, dtype=np.float32)
    ann.save_fit(vector, {"cluster": 3, "method": "card", "report": {"pairs": 20}}, {"bundle_sha256": "f00"})
    assert np.array_equal(ann.vector(), vector) and ann.vector().dtype == np.float32
    assert ann.vector_metadata() == {"bundle_sha256": "f00"}
    state = ann.state()
    assert state["cluster"] == 3 and state["report"] == {"pairs": 20} and state["vector_dim"] == 16
    ann.save_state({"cluster": 4})  # keeps the link to the vector it does not mention
    assert np.array_equal(ann.vector(), vector) and ann.state()["cluster"] == 4
    ann.save_vector(vector * 2, {"bundle_sha256": "f01"})
    assert np.array_equal(ann.vector(), vector * 2) and ann.state()["cluster"] == 4
    assert len(list(ann.dir.glob("vector-*.safetensors"))) == 1
    ann.save_fit(None, {"cluster": 5, "method": "global"})  # cold start: no vector
    assert ann.vector() is None and not list(ann.dir.glob("vector-*"))


def test_save_fit_rejects_bad_vectors() -> None:
    ann = UserStore().create("ann")
    for bad in (np.zeros((2, 3)), np.zeros(0), np.array([1.0, np.nan])):
        with pytest.raises(ValueError):
            ann.save_fit(bad, {})
    with pytest.raises(TypeError):
        ann.save_fit(np.zeros(3), {}, {"n": 1})  # type: ignore[dict-item]


@pytest.mark.parametrize("failing_call", [1, 2])
def test_interrupted_fit_keeps_the_previous_pair(monkeypatch: pytest.MonkeyPatch, failing_call: int) -> None:
    ann = UserStore().create("ann")
    old = np.full(8, 0.5, np.float32)
    ann.save_fit(old, {"cluster": 1, "report": {"run": "old"}})
    real_replace = os.replace
    calls = []

    def crashing_replace(src, dst):  # the vector's replace is call 1, the state's call 2
        calls.append(dst)
        if len(calls) == failing_call:
            raise OSError("simulated crash")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crashing_replace)
    with pytest.raises(OSError, match="simulated crash"):
        ann.save_fit(np.full(8, 9.0, np.float32), {"cluster": 2, "report": {"run": "new"}})
    monkeypatch.setattr(os, "replace", real_replace)

    assert np.array_equal(ann.vector(), old)
    assert ann.state()["cluster"] == 1 and ann.state()["report"] == {"run": "old"}
    assert not [p for p in ann.dir.iterdir() if p.name.endswith(".tmp")]
    ann.save_fit(np.full(8, 2.0, np.float32), {"cluster": 3})  # the next fit tidies the orphan
    assert len(list(ann.dir.glob("vector-*.safetensors"))) == 1 and ann.vector()[0] == 2.0


def damage(ann, data: bytes, *, fix_sha: bool) -> Path:
    """Overwrite the current vector file, optionally recording the new bytes' sha in state.json."""
    import hashlib

    path = ann.vector_path()
    path.write_bytes(data)
    if fix_sha:
        state = json.loads(ann.state_path.read_text())
        state["vector_sha256"] = hashlib.sha256(data).hexdigest()
        ann.state_path.write_text(json.dumps(state))
    return path


def assert_one_line(exc: pytest.ExceptionInfo, *fragments: str) -> None:
    message = str(exc.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize(
    ("data", "fix_sha", "expected"),
    [
        (b"not a safetensors file at all", True, "is not a readable safetensors file"),
        (save({"lambda": np.zeros(8, np.float64)}), True, "is float64 (8,), expected float32 (D,)"),
        (save({"lambda": np.zeros((2, 4), np.float32)}), True, "expected float32 (D,)"),
        (save({"other": np.zeros(8, np.float32)}), True, "has no tensor 'lambda'"),
        (
            save({"lambda": np.zeros(6, np.float32)}),
            True,
            "has 6 values but field 'vector_dim' of state.json says 8",
        ),
        (save({"lambda": np.ones(8, np.float32)}), False, "does not match the sha256 recorded in state.json"),
    ],
    ids=["garbage", "float64", "2-d", "no-lambda", "wrong-dim", "sha-mismatch"],
)
def test_damaged_vector_is_refused(data: bytes, fix_sha: bool, expected: str) -> None:
    ann = UserStore().create("ann")
    ann.save_fit(np.zeros(8, np.float32), {"cluster": 1})
    path = damage(ann, data, fix_sha=fix_sha)
    with pytest.raises(LocalpersError) as exc:
        ann.vector()
    assert_one_line(exc, str(path), expected, "run `localpers fit --user ann` again")


def test_a_state_naming_a_vector_without_its_sha256_says_so() -> None:
    """It was reported as a file that "does not match the sha256 recorded", where none was recorded (store audit)."""
    ann = UserStore().create("ann")
    ann.save_fit(np.zeros(8, np.float32), {"cluster": 1})
    state = json.loads(ann.state_path.read_text())
    del state["vector_sha256"]
    ann.state_path.write_text(json.dumps(state))
    with pytest.raises(LocalpersError) as exc:
        ann.vector()
    assert_one_line(
        exc, "state.json is damaged", "has no field 'vector_sha256'", "run `localpers fit --user ann`"
    )


def test_an_imported_users_files_are_on_disk_before_the_user_appears(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The staged files were never flushed: a crash soon after the folder's rename could leave an imported user
    with an empty history, which reads as no history without a word (store audit)."""
    store = UserStore()
    ann = store.create("ann")
    ann.save_history([HistoryItem.create("headline", "An article.", "A headline")])
    archive = store.export("ann", tmp_path / "ann.zip", with_history=True)
    synced: list[str] = []
    fsync = os.fsync

    def recording(descriptor: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{descriptor}"))
        fsync(descriptor)

    monkeypatch.setattr(os, "fsync", recording)
    bob = store.import_(archive, "bob")
    staged = {Path(name).name for name in synced if "/.importing-" in name}
    assert {"history.jsonl", "state.json", ".identity"} <= staged
    assert any(Path(name).name.startswith(".importing-") for name in synced)  # the folder, before its rename
    assert [item.output for item in bob.history()] == ["A headline"]


def test_missing_vector_file_is_refused() -> None:
    ann = UserStore().create("ann")
    ann.save_fit(np.zeros(8, np.float32), {})
    ann.vector_path().unlink()
    with pytest.raises(LocalpersError) as exc:
        ann.vector()
    assert_one_line(exc, "is missing although state.json names it", "run `localpers fit --user ann` again")


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"vector_file": "../../etc/passwd"}'])
def test_damaged_state_is_refused(text: str) -> None:
    ann = UserStore().create("ann")
    ann.state_path.write_text(text)
    with pytest.raises(LocalpersError) as exc:
        ann.vector()
    assert_one_line(
        exc, str(ann.state_path), "is damaged", "remove it and run `localpers fit --user ann` again"
    )
    ann.save_fit(np.ones(2, np.float32), {"cluster": 0})  # a new fit repairs it
    assert ann.vector() is not None


def test_damaged_history_and_active_pointer() -> None:
    store = UserStore()
    ann = store.create("ann")
    ann.save_history(items(2))
    with ann.history_path.open("a") as handle:
        handle.write('{"input": "x"}\n')
    with pytest.raises(LocalpersError) as exc:
        ann.history()
    assert_one_line(exc, str(ann.history_path), "line 3: missing field 'output'", "remove the file")
    store.active_path.write_text("{")
    with pytest.raises(LocalpersError) as exc:
        store.active_name()
    assert_one_line(exc, "active.json is damaged", "localpers user use NAME")
    store.use("ann")  # repairs the pointer
    assert store.active_name() == "ann"


def test_history_limit_on_save() -> None:
    ann = UserStore().create("ann")
    with pytest.raises(LocalpersError, match="would have 501 history items"):
        ann.save_history(items(501))


def test_export_and_import(tmp_path: Path) -> None:
    store = UserStore()
    ann = store.create("ann")
    ann.save_history(items(4))
    ann.save_fit(
        np.arange(8, dtype=np.float32), {"cluster": 2, "report": {"pairs": 4}}, {"bundle_sha256": "b"}
    )

    plain = store.export("ann", tmp_path)
    assert plain == tmp_path / "localpers-user-ann.zip"
    with zipfile.ZipFile(plain) as archive:
        names = set(archive.namelist())
        manifest = json.loads(archive.read("manifest.json"))
        assert "history.jsonl" not in names
        assert not any(SECRET.encode() in archive.read(n) for n in names)
    assert manifest["cluster"] == 2 and manifest["with_history"] is False
    with pytest.raises(LocalpersError, match="already exists"):
        store.export("ann", plain)

    full = store.export("ann", tmp_path / "full.zip", with_history=True)
    with pytest.raises(LocalpersError, match="user 'ann' already exists"):
        store.import_(full)
    copy = store.import_(full, "ann-copy")
    assert copy.history() == ann.history()
    assert np.array_equal(copy.vector(), ann.vector()) and copy.vector_metadata() == {"bundle_sha256": "b"}
    assert store.import_(plain, "ann-lite").history() == []


@pytest.mark.parametrize("clock", [0.0, 4_500_000_000.0])  # 1970 (no battery-backed clock), 2112
def test_export_works_whatever_the_clock_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: float
) -> None:
    store = UserStore()
    store.create("ann").save_history(items(2))
    monkeypatch.setattr("time.time", lambda: clock)  # zip writes no date before 1980 or after 2107
    exported = store.export("ann", tmp_path / "ann.zip", with_history=True)
    with zipfile.ZipFile(exported) as archive:
        assert {info.date_time for info in archive.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    assert store.import_(exported, "ann-copy").history() == store.get("ann").history()


def test_import_refuses_damaged_archives(tmp_path: Path) -> None:
    store = UserStore()
    store.create("ann").save_fit(np.ones(4, np.float32), {"cluster": 1})
    good = store.export("ann", tmp_path / "good.zip")
    with zipfile.ZipFile(good) as archive:
        members = {n: archive.read(n) for n in archive.namelist()}

    def rewrite(name: str, changes: dict[str, bytes]) -> Path:
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as archive:
            for member, data in {**members, **changes}.items():
                archive.writestr(member, data)
        return path

    vector_name = next(n for n in members if n.startswith("vector-"))
    cases = {
        rewrite("tampered.zip", {vector_name: b"xx"}): "does not match its sha256",
        rewrite("extra.zip", {"../evil.sh": b"rm"}): "unexpected file",
        rewrite("nomanifest.zip", {"manifest.json": b"{"}): "manifest.json is not valid JSON",
    }
    (tmp_path / "notzip.zip").write_bytes(b"plain text")
    cases[tmp_path / "notzip.zip"] = "not a localpers user archive"
    for path, expected in cases.items():
        with pytest.raises(LocalpersError, match=expected):
            store.import_(path, "copy")
        assert store.list() == ["ann"]
    assert not [p for p in store.users_dir.iterdir() if p.name.startswith(".")]


def test_only_the_owner_can_list_the_users_or_enter_their_folders() -> None:
    """Other local accounts could list users/ (0755) and so every user's name (privacy audit)."""
    store = UserStore()
    user = store.create("ann")
    assert store.users_dir.stat().st_mode & 0o077 == 0
    assert user.dir.stat().st_mode & 0o077 == 0


def test_a_users_folder_made_open_by_an_earlier_version_is_closed() -> None:
    store = UserStore()
    store.create("ann")
    store.users_dir.chmod(0o755)
    store.create("bob")
    assert store.users_dir.stat().st_mode & 0o077 == 0


def test_history_ids_are_read_again_only_after_the_history_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fit asks at each cache write which items are still there: 27 ms a read at 500 items, so it is memoised."""
    from localpers.users.folder import User

    user = UserStore().create("ann")
    first = [HistoryItem.create("headline", f"article {n}", f"Headline {n}") for n in range(3)]
    user.save_history(first)
    reads = []
    history = User.history
    monkeypatch.setattr(User, "history", lambda self: reads.append(1) or history(self))
    assert user.history_ids() == {item.id for item in first}
    assert user.history_ids() == {item.id for item in first}
    assert len(reads) == 1
    user.save_history(first[1:], removing=True)
    assert user.history_ids() == {item.id for item in first[1:]}
    assert len(reads) >= 2


def test_a_history_at_the_size_limit_exports_and_imports_back(tmp_path: Path) -> None:
    from localpers.users.history import MAX_HISTORY_FILE_BYTES, serialize_history

    store = UserStore()
    user = store.create("big")
    article = "東" * 100_000  # 300,000 bytes in UTF-8: the longest input an item keeps
    items = [HistoryItem.create("headline", article + f" {n}", f"Headline {n}") for n in range(223)]
    size = len(serialize_history(items).encode("utf-8"))
    pad = MAX_HISTORY_FILE_BYTES - size - 200  # one more item that brings the file just under the limit
    items.append(HistoryItem.create("headline", "東" * (pad // 3), "Last"))
    last_size = len(serialize_history(items).encode("utf-8"))
    assert MAX_HISTORY_FILE_BYTES - 1024 < last_size <= MAX_HISTORY_FILE_BYTES
    user.save_history(items)
    archive = store.export("big", tmp_path / "big.zip", with_history=True)
    again = store.import_(archive, "big2")
    assert again.history_path.read_bytes() == user.history_path.read_bytes()


def test_a_history_over_the_item_limit_is_refused_at_export_not_at_restore(tmp_path: Path) -> None:
    """A history made longer by hand works, and exported; its archive was then refused by import, a backup that
    could not be restored."""
    from localpers.users.history import MAX_HISTORY_ITEMS

    store = UserStore()
    user = store.create("long")
    items = [
        HistoryItem.create("headline", f"Article {n}.", f"Headline {n}") for n in range(MAX_HISTORY_ITEMS + 2)
    ]
    user.save_history(items, removing=True)  # as a file joined by hand
    with pytest.raises(InputError, match=r"`localpers history remove --oldest 2 --user long`, then export"):
        store.export("long", tmp_path / "long.zip", with_history=True)
    assert not (tmp_path / "long.zip").exists()
    store.export("long", tmp_path / "state-only.zip")  # without the history there is nothing to refuse
    user.save_history(items[2:], removing=True)
    assert (
        len(store.import_(store.export("long", tmp_path / "long.zip", with_history=True), "back").history())
        == 500
    )


def test_a_user_deleted_while_a_command_runs_is_not_read_as_one_with_no_history_or_fit() -> None:
    store = UserStore()
    ann = store.create("ann")  # the command's User, taken before the delete
    ann.save_history([HistoryItem.create("headline", "An article.", "A Headline")])
    store.delete("ann")
    for read in (ann.history, ann.state):
        with pytest.raises(LocalpersError, match="user 'ann' no longer exists"):
            read()
    bob = store.create("bob")  # a user with no history and no fit yet still reads as such
    assert bob.history() == [] and isinstance(bob.state(), dict)


def test_a_fit_committed_while_a_fit_is_read_is_read_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """state.json and the vector were read separately: a fit another command committed between the two reads gave
    one fit's state with the next one's vector (a rewrite, the API, the TUI), or an archive whose state named a
    vector it did not hold, which `user import` then refused (concurrent-use audit)."""
    from localpers.methods.card.user_state import user_profile
    from localpers.users.folder import User

    store = UserStore()
    user = store.create("ann")
    user.save_fit(np.ones(4, np.float32), {"cluster": 1, "fit": {"mode": "vector"}})
    original = User._load_vector
    commits = [2.0]

    def another_fit_commits_first(self: User, state: dict[str, object] | None = None) -> object:
        if commits:  # `localpers fit` in a shell stores its fit between this command's reads
            value = commits.pop(0)
            user.save_fit(np.full(4, value, np.float32), {"cluster": int(value), "fit": {"mode": "vector"}})
        return original(self, state) if state is not None else original(self)

    monkeypatch.setattr(User, "_load_vector", another_fit_commits_first)
    cluster, vector, state = user_profile(user)
    assert vector is not None and (cluster, float(vector[0])) == (2, 2.0)
    commits.append(3.0)
    archive = store.export("ann", Path(os.environ["LOCALPERS_HOME"]) / "ann.zip")
    with zipfile.ZipFile(archive) as packed:
        named = json.loads(packed.read("state.json"))["vector_file"]
        assert named in packed.namelist()
    assert float(store.import_(archive, "back").vector()[0]) == 3.0
