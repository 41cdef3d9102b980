"""One writer at a time per user: concurrent history changes keep every item, a deleted user is not written."""

import multiprocessing
import threading
import time
from pathlib import Path

import pytest

from localpers.errors import LocalpersError
from localpers.tui.userdata import accept_output
from localpers.users.lock import user_lock
from localpers.users.store import UserStore


def _accept_many(root: str, worker: int, count: int, start: "multiprocessing.synchronize.Event") -> None:
    user = UserStore(root=Path(root)).get("ann")
    start.wait()
    for k in range(count):
        accept_output(user, "headline", f"article {worker}-{k} about the harbour", f"Headline {worker}-{k}")


def test_concurrent_processes_keep_every_accepted_item(tmp_path: Path) -> None:
    UserStore(root=tmp_path).create("ann")
    context = multiprocessing.get_context("fork")
    start = context.Event()
    workers = [context.Process(target=_accept_many, args=(str(tmp_path), w, 6, start)) for w in range(4)]
    for process in workers:
        process.start()
    start.set()
    for process in workers:
        process.join(60)
        assert process.exitcode == 0
    history = UserStore(root=tmp_path).get("ann").history()
    assert sorted(item.output for item in history) == sorted(
        f"Headline {w}-{k}" for w in range(4) for k in range(6)
    )


def _hold_lock(
    folder: str,
    held: "multiprocessing.synchronize.Event",
    leaving: "multiprocessing.sharedctypes.Synchronized",
    seconds: float,
) -> None:
    with user_lock(Path(folder), who="user 'ann'"):
        held.set()
        time.sleep(seconds)
        leaving.value = 1  # the last thing done under the lock


def test_a_second_process_waits_then_gives_up_with_one_line(tmp_path: Path) -> None:
    ann = UserStore(root=tmp_path).create("ann")
    context = multiprocessing.get_context("fork")
    held = context.Event()
    leaving = context.Value("i", 0)
    holder = context.Process(target=_hold_lock, args=(str(ann.dir), held, leaving, 3.0))
    holder.start()
    try:
        assert held.wait(20)
        started = time.monotonic()
        busy = r"^user 'ann' is busy: another localpers command is changing it"
        with (
            pytest.raises(LocalpersError, match=busy),
            user_lock(ann.dir, who="user 'ann'", wait_seconds=0.3),
        ):
            pass
        assert time.monotonic() - started < 2.5
        with user_lock(ann.dir, who="user 'ann'", wait_seconds=20):  # waits for the holder, then gets it
            assert leaving.value == 1
    finally:
        holder.join(20)


def test_threads_take_turns_and_one_thread_may_nest(tmp_path: Path) -> None:
    ann = UserStore(root=tmp_path).create("ann")
    inside: list[int] = []
    overlaps: list[int] = []

    def work() -> None:
        for _ in range(20):
            with ann.locked(), ann.locked():  # nested in one thread: no deadlock
                inside.append(1)
                if len(inside) > 1:
                    overlaps.append(len(inside))
                time.sleep(0.001)
                inside.pop()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert overlaps == [] and not any(thread.is_alive() for thread in threads)


def test_a_change_waiting_on_a_deleted_user_writes_nothing(tmp_path: Path) -> None:
    store = UserStore(root=tmp_path)
    ann = store.create("ann")
    outcome: list[BaseException] = []
    deleting = threading.Event()

    def add_after_delete() -> None:
        deleting.wait()
        try:
            accept_output(ann, "headline", "an article", "A headline")
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(exc)

    adder = threading.Thread(target=add_after_delete)
    with ann.locked():  # the delete below nests in this lock; the adder waits on it
        adder.start()
        deleting.set()
        time.sleep(0.2)
        store.delete("ann")
    adder.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], LocalpersError)
    assert "no longer exists" in str(outcome[0])
    assert store.list() == [] and not ann.dir.exists()
    assert not [p for p in store.users_dir.iterdir()]


def test_a_killed_writers_staging_folder_is_swept_a_live_ones_is_not(tmp_path: Path) -> None:
    store = UserStore(root=tmp_path)
    store.create("ann")
    context = multiprocessing.get_context("fork")
    gone = context.Process(target=time.sleep, args=(0,))
    gone.start()
    gone.join()
    dead = store.users_dir / f".creating-{gone.pid}-abcdef"
    live = store.users_dir / f".importing-{multiprocessing.current_process().pid}-abcdef"
    legacy = store.users_dir / ".deleting-0123456789ab"
    for folder in (dead, live, legacy):
        folder.mkdir()
    store.create("bob")
    assert not dead.exists() and not legacy.exists() and live.exists()


def _accept_expecting_gone(root: str, ready: "multiprocessing.synchronize.Event") -> None:
    user = UserStore(root=Path(root)).get("ann")
    ready.set()
    try:
        accept_output(user, "headline", "an article", "A headline")
    except LocalpersError as exc:
        raise SystemExit(3 if "no longer exists" in str(exc) else 4) from None
    raise SystemExit(0)


def test_another_process_waiting_on_a_deleted_user_writes_nothing(tmp_path: Path) -> None:
    store = UserStore(root=tmp_path)
    ann = store.create("ann")
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    waiter = context.Process(target=_accept_expecting_gone, args=(str(tmp_path), ready))
    with ann.locked():
        waiter.start()
        assert ready.wait(20)
        time.sleep(0.5)  # the waiter has opened the lock file and polls it
        store.delete("ann")
    waiter.join(30)
    assert waiter.exitcode == 3
    assert store.list() == [] and not [p for p in store.users_dir.iterdir()]


def test_a_link_at_the_lock_files_name_is_refused_not_followed(tmp_path: Path) -> None:
    folder = tmp_path / "ann"
    folder.mkdir()
    outside = tmp_path / "outside" / "target"
    outside.parent.mkdir()
    (folder / ".lock").symlink_to(outside)  # dangling: following it would create a file outside the folder
    with pytest.raises(LocalpersError, match="is a symbolic link"), user_lock(folder, who="user 'ann'"):
        pass
    assert not outside.exists()
